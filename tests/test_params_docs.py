"""The docs' parameter tables are built from the nodes' one description of each parameter
(`Param`, and the typed configs' described fields: robot_drivers.described), never restated:
each table in docs/observation_topics.md section 7 is `node_params.docs_table` of its node.

    python tests/test_params_docs.py     # rewrites the tables from the code
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from robot_drivers import (  # noqa: E402
    go2_sdk_driver_node,
    ingestion_node,
    mujoco_driver_node,
    safety_node,
    ur5e_rtde_driver_node,
)
from robot_drivers.described import Param  # noqa: E402
from robot_drivers.hardware.realtime_driver import COMMON_PARAMS  # noqa: E402
from robot_drivers.node_params import docs_table  # noqa: E402
from simdist_adapter import adapter_node  # noqa: E402

DOC = ROOT / "docs" / "observation_topics.md"


def _union(*lists: tuple[Param, ...]) -> list[Param]:
    """The parameters of every list, each name once (the first list's default)."""
    seen: dict[str, Param] = {}
    for params in lists:
        for p in params:
            seen.setdefault(p.name, p)
    return list(seen.values())


def tables() -> dict[str, list[str]]:
    """Each documented node's heading -> its table (the supervisor's: the UR5e's parameters,
    then the Go2's joint-target limits with the Go2's defaults)."""
    return {
        "safety_supervisor (safety_supervisor_node)": docs_table(
            _union(safety_node.node_params("ur5e"), safety_node.node_params("go2"))
        ),
        "ingestion (ingestion_node)": docs_table(ingestion_node.PARAMS),
        "mujoco_driver (mujoco_driver_node)": docs_table(mujoco_driver_node.PARAMS),
        "ur5e_driver (ur5e_rtde_driver_node)": docs_table(
            COMMON_PARAMS + ur5e_rtde_driver_node.PARAMS
        ),
        "go2_driver (go2_sdk_driver_node)": docs_table(COMMON_PARAMS + go2_sdk_driver_node.PARAMS),
        "adapter (adapter_node)": docs_table(adapter_node.PARAMS),
    }


def documented(text: str, heading: str) -> list[str]:
    """The table lines under `### heading`."""
    match = re.search(rf"^### {re.escape(heading)}\n((?:\|.*\n)+)", text, re.M)
    assert match, f"docs/observation_topics.md has no table under '### {heading}'"
    return match.group(1).splitlines()


def test_every_parameter_table_is_built_from_the_nodes_parameters():
    text = DOC.read_text()
    for heading, rows in tables().items():
        assert documented(text, heading) == rows, (
            f"docs/observation_topics.md '{heading}' differs from the code: "
            "run python tests/test_params_docs.py"
        )


if __name__ == "__main__":
    text = DOC.read_text()
    for heading, rows in tables().items():
        table = "\n".join(rows) + "\n"
        text = re.sub(
            rf"^(### {re.escape(heading)}\n)(?:\|.*\n)+",
            lambda m: m.group(1) + table,
            text,
            flags=re.M,
        )
    DOC.write_text(text)
