"""Register inspection for tests, the way simple_switch_CLI reads BMv2's registers over Thrift:
a line-based TCP service on loopback. `register_read NAME INDEX` answers `NAME[INDEX]= VALUE`;
`register_dump NAME` answers `NAME= V0 V1 ...`, every cell at one instant (what BMv2's
`serialize_state` gives whole, where its `register_read` stops at 64 bits)."""

from __future__ import annotations

import socketserver
import threading

from switch_model.pipeline import Pipeline


def serve_inspection(pipeline: Pipeline, host: str, port: int) -> socketserver.TCPServer:
    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            for raw in self.rfile:
                words = raw.decode(errors="replace").split()
                if not words:
                    continue
                if words[0] == "register_read" and len(words) == 3 and words[2].isdigit():
                    try:
                        with pipeline.state.lock:
                            value = pipeline.slots.read(words[1], int(words[2]))
                        reply = f"{words[1]}[{words[2]}]= {value}"
                    except (KeyError, IndexError) as e:
                        reply = f"Error: {e}"
                elif words[0] == "register_dump" and len(words) == 2:
                    try:
                        with pipeline.state.lock:
                            cells = pipeline.slots.dump(words[1])
                        reply = f"{words[1]}= " + " ".join(map(str, cells))
                    except KeyError as e:
                        reply = f"Error: {e}"
                else:
                    reply = "Error: usage: register_read NAME INDEX | register_dump NAME"
                self.wfile.write((reply + "\n").encode())

    socketserver.TCPServer.allow_reuse_address = True
    server = socketserver.ThreadingTCPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
