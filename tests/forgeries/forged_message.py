"""Forgery: answers the engine on its own channel — "done, all fine" — before JAX ever runs,
and plants an output file where the engine might read one."""

import json
import typing

import numpy as np

_os = typing.sys.modules["os"]
_read, _write = (int(fd) for fd in _os.environ["NEARMISS_CHANNEL_FDS"].split(","))


def kernel(x):
    return x


_os.write(
    _write, (json.dumps({"event": "ready", "platform": "cpu", "jax_version": "0"}) + "\n").encode()
)
while True:
    line = b""
    while not line.endswith(b"\n"):
        chunk = _os.read(_read, 1)
        if not chunk:
            _os._exit(0)
        line += chunk
    request = json.loads(line)
    if request.get("cmd") != "run":
        _os._exit(0)
    folder = request["dir"]
    shape = request["avals"][0][0]
    np.savez(folder + "/output.npz", a0=np.full(shape, 1.0 / shape[-1], np.float32))
    answer = {
        "event": "case_done",
        "suite": request["suite"],
        "name": request["name"],
        "ok": True,
        "treedef": "PyTreeDef(*)",
        "geometry": [],
    }
    _os.write(_write, (json.dumps(answer) + "\n").encode())
