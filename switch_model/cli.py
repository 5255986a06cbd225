"""`passing-switch-model`: the software PASSING switch, started like simple_switch_grpc.

    passing-switch-model --device-id 0 -i 1@veth1 -i 2@veth2 \\
        --grpc-server-addr 127.0.0.1:9559 --inspect-addr 127.0.0.1:9090
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from passing.pipeline_files import load_p4info
from switch_model import fastpath
from switch_model.inspect_server import serve_inspection
from switch_model.p4runtime_server import P4RuntimeService, serve
from switch_model.pipeline import Pipeline
from switch_model.ports import MAX_FRAME, Ports


def _interface(spec: str) -> tuple[int, str]:
    port, sep, ifname = spec.partition("@")
    if not sep or not port.isdigit() or not ifname:
        raise argparse.ArgumentTypeError(f"expected PORT@INTERFACE (e.g. 1@veth1), got {spec!r}")
    if int(port) >= 1 << 9:
        raise argparse.ArgumentTypeError(f"port {port}: v1model ports are 9 bits (0-511)")
    return int(port), ifname


def _address(spec: str) -> tuple[str, int]:
    host, sep, port = spec.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {spec!r}")
    return host, int(port)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="passing-switch-model",
        description="Software model of the PASSING P4 switch: the pipeline of p4src/ in Python "
                    "on raw-socket ports, with a P4Runtime server (same names as the P4Info).",
        epilog="example: passing-switch-model --device-id 1 -i 1@s1-eth1 -i 2@s1-eth2 "
               "--grpc-server-addr 127.0.0.1:10001")
    p.add_argument("-i", "--interface", action="append", type=_interface, default=[],
                   metavar="PORT@IFACE", help="attach switch port PORT to interface IFACE")
    p.add_argument("--device-id", type=int, default=0, help="P4Runtime device id (default 0)")
    p.add_argument("--grpc-server-addr", default="127.0.0.1:9559",
                   help="P4Runtime listen address (default 127.0.0.1:9559)")
    p.add_argument("--inspect-addr", type=_address, default=None, metavar="HOST:PORT",
                   help="serve register_read for tests on this TCP address")
    p.add_argument("--p4info", default=None,
                   help="P4Info text file (default: p4src/passing.p4info.txtpb)")
    p.add_argument("--no-p4", action="store_true",
                   help="start without a pipeline until a controller pushes one (like BMv2)")
    p.add_argument("--pipeline", choices=("compiled", "python"),
                   default=os.environ.get(fastpath.PATH_ENV, "compiled"),
                   help="compiled: PASSING packets through switch_model/fastpath.c (built on "
                        "first use; the Python pipeline where no C compiler is found), other "
                        "frames through the Python pipeline; python: every frame through the "
                        "Python pipeline (default: $PASSING_MODEL_PIPELINE, else compiled)")
    p.add_argument("--log-level", default="WARNING")
    args = p.parse_args(argv)
    ports = [port for port, _ in args.interface]
    if len(set(ports)) != len(ports):
        p.error("a port number is given twice in -i")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    info = load_p4info(args.p4info)
    pipeline = Pipeline.from_p4info(info)
    if args.pipeline == "compiled":
        pipeline.use_compiled()
    service = P4RuntimeService(pipeline, args.device_id, info, preloaded=not args.no_p4)
    try:
        ports = Ports(dict(args.interface))
    except OSError as e:
        print(f"passing-switch-model: cannot open the interfaces: {e}", file=sys.stderr)
        return 1
    try:
        server = serve(service, args.grpc_server_addr)
    except OSError as e:
        print(f"passing-switch-model: {e}", file=sys.stderr)
        ports.close()
        return 1
    inspect = serve_inspection(pipeline, *args.inspect_addr) if args.inspect_addr else None
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        ports.run(pipeline, stop)
    finally:
        server.stop(grace=0.5)
        if inspect is not None:
            inspect.shutdown()
        ports.close()
        if ports.tx_errors or ports.rx_truncated:
            # Frames lost inside this process are otherwise invisible: no counter of the P4
            # program sees them.
            print(f"passing-switch-model: {ports.tx_errors} frames refused by the kernel on "
                  f"send (lost), {ports.rx_truncated} frames longer than "
                  f"{MAX_FRAME} bytes dropped on receive", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
