"""Every host of a loopback job in its own thread, as the hosts of a real job run at once."""

from __future__ import annotations

import threading
from collections.abc import Callable


def each_host(work: Callable[[int], None], hosts: int, timeout: float = 60.0) -> None:
    """work(i) for every host i at once; the first error any raised is raised here."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            work(i)
        except Exception as e:  # raised below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(hosts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not errors, errors
