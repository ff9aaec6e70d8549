"""Misbehaviours for the sandbox tests; run only inside the sandbox child."""

from __future__ import annotations

import ctypes
import os
import socket
import time


def main(args: list[str]) -> None:
    what = args[0]
    if what == "ok":
        print("fine")
    elif what == "env":
        print(" ".join(sorted(os.environ)))
    elif what == "cwd":
        print(os.getcwd())
    elif what == "net":
        try:
            socket.create_connection(("10.255.255.1", 80), timeout=2).close()
            print("connected")
        except OSError as exc:
            print(f"refused: {exc}")
    elif what == "spin":
        while True:
            pass
    elif what == "sleep":
        time.sleep(3600)
    elif what == "memory":
        blob = bytearray(8 << 30)
        print(len(blob))
    elif what == "segv":
        ctypes.string_at(0)
    elif what == "exit":
        os._exit(0)
    elif what == "fork_and_hang":
        child = os.fork()
        if child == 0:
            time.sleep(3600)
            os._exit(0)
        print(child, flush=True)
        time.sleep(3600)
