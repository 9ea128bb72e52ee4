"""What this machine can serve, asked in a child so the engine never loads libtpu or a GPU plugin.

``python -m nearmiss.engine.targets.probe tpu`` prints ``{"topologies": {name: device_kind},
"errors": {name: message}}`` for every TPU target's compile-only topology; ``... gpu`` (run
with ``JAX_PLATFORMS`` naming one GPU platform) prints ``{"devices": N}``. One JSON line on
stdout, always; failures are data.
"""

from __future__ import annotations

import json
import sys
from typing import cast

from nearmiss.engine.targets.libtpu_env import prepare_environment


def probe_tpu() -> dict:
    prepare_environment()
    from jax.experimental import topologies

    from nearmiss.engine.targets.registry import TARGETS

    answer: dict = {"topologies": {}, "errors": {}}
    for target in TARGETS.values():
        if not target.is_tpu:
            continue
        try:
            devices = topologies.get_topology_desc(
                platform="tpu", topology_name=cast(str, target.topology)
            ).devices
            # jaxlib's _jax extension has no stub: its Device is unknown to the checker
            answer["topologies"][target.topology] = devices[0].device_kind  # type: ignore[attr-defined]
        except Exception as exc:  # libtpu's refusal is the answer
            answer["errors"][target.topology] = str(exc).strip().splitlines()[0][:300]
    return answer


def probe_gpu() -> dict:
    import jax

    try:
        return {"devices": len(jax.devices())}
    except Exception as exc:  # no GPU, no driver: the answer
        return {"devices": 0, "error": str(exc).strip().splitlines()[0][:300]}


def main() -> None:
    kind = sys.argv[1] if len(sys.argv) > 1 else "tpu"
    try:
        answer = probe_tpu() if kind == "tpu" else probe_gpu()
    except Exception as exc:
        answer = {"error": f"{type(exc).__name__}: {str(exc).strip()[:300]}"}
    print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
