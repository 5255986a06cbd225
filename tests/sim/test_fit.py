"""`python -m sim fit`: the emulation's unmeasured constants fitted to a report's cells, each on
its own cells, and written back to sim/fitted.json with where they came from."""

import json
import math

import pytest

from sim import costs, fit, measured
from tests.sim.test_validate import FAKE

TRUE = {"gloo_step_s": 0.0061, "gloo_local_s": 0.027, "frame_cpu_fwd": 2.25}
GROUP = {"ring": "gloo_step_s", "hier-ring": "gloo_local_s"}


def report_with_every_group() -> measured.Report:
    rep = measured.parse(FAKE.format(passing=450.0, ring=880.0))
    cell = rep.cells[0]
    cells = [cell.__class__(cell.topology, "model", 4, 2, bw, size, strategy, 100.0)
             for bw, size, strategy in ((20, 256 << 10, "ring"), (20, 1 << 20, "ring"),
                                        (20, 256 << 10, "hier-ring"),
                                        (100, 1 << 20, "passing"), (100, 4 << 20, "ring"))]
    return measured.Report(rep.date, rep.calibration, tuple(cells))


def synthetic(report, cells, constants, workers):
    """Log ratios as a simulator whose every cell depends on the constant fitted to it (and a
    little on the others, as the shared CPU makes them), exact at TRUE."""
    out = []
    for c in cells:
        name = GROUP.get(c.strategy, "frame_cpu_fwd") if c.bw_mbps == 20 else "frame_cpu_fwd"
        own = (0.1 + 10 * constants[name]) / (0.1 + 10 * TRUE[name])
        cross = 1 + 0.01 * (constants["frame_cpu_fwd"] - TRUE["frame_cpu_fwd"])
        skew = 1.0 if c.size_bytes == 1 << 20 else 1.04  # no value fits every cell exactly
        out.append(math.log(own * cross * skew))
    return out


def test_fit_finds_each_constant_on_its_own_cells(monkeypatch):
    monkeypatch.setattr(fit, "_log_ratios", synthetic)
    result = fit.fit(report_with_every_group(), log=lambda _: None)
    assert set(result.constants) == set(TRUE)
    assert result.constants["gloo_step_s"] == pytest.approx(TRUE["gloo_step_s"], rel=0.08)
    assert result.constants["gloo_local_s"] == pytest.approx(TRUE["gloo_local_s"], rel=0.08)
    assert result.constants["frame_cpu_fwd"] == pytest.approx(TRUE["frame_cpu_fwd"], abs=0.2)
    assert all(1 <= w < 1.1 for w in result.worst.values())
    assert all("2030-01-01 00:00 UTC" in s for s in result.sources.values())


def test_fit_refuses_a_report_without_the_cells_a_constant_needs():
    rep = measured.parse(FAKE.format(passing=450.0, ring=880.0))  # no hier-ring, no 100 Mbit/s
    with pytest.raises(ValueError, match="gloo_local_s"):
        fit.cells_for(rep)


def test_write_fitted_replaces_only_the_fitted_constants(tmp_path, monkeypatch):
    path = tmp_path / "fitted.json"
    path.write_text(json.dumps({"shm_gbps": {"value": 18.0, "source": "read"},
                                "gloo_step_s": {"value": 1.0, "source": "old"}}))
    monkeypatch.setattr(costs, "FITTED_FILE", path)
    costs.write_fitted({"gloo_step_s": 0.004}, {"gloo_step_s": "new fit"})
    assert json.loads(path.read_text()) == {"shm_gbps": {"value": 18.0, "source": "read"},
                                            "gloo_step_s": {"value": 0.004, "source": "new fit"}}


def test_the_kernel_is_costed_in_model_switch_frames_whichever_target_runs():
    rep = measured.parse(FAKE.format(passing=450.0, ring=880.0))
    bmv2, model = rep.calibration["bmv2"], rep.calibration["model"]
    assert bmv2.kernel_unit_pps == model.switch_fwd_pps == 175000
    per_frame = costs.fitted("frame_cpu_fwd") / 175000
    assert costs.emulation(bmv2).frame_cpu_s == pytest.approx(per_frame)
    assert costs.emulation(bmv2, {"frame_cpu_fwd": 1.0}).frame_cpu_s == pytest.approx(1 / 175000)


def test_every_fitted_constant_names_a_report_kept_beside_it():
    # A fit is reproducible only from the report it was fitted to: sim/data keeps it, and
    # `python -m sim fit --measured sim/data/<file>` reads it.
    data = costs.FITTED_FILE.parent / "data"
    for name, (_, source) in costs.FITTED.items():
        if "python -m sim fit" not in source:
            continue
        kept = source.rsplit("; ", 1)[-1]
        rep = measured.load(data / kept)
        assert fit.cells_for(rep)[name], name
        assert rep.date in source, name
