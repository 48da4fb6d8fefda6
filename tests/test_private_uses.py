"""Each private use of a dependency listed in docs/architecture.md ("Private uses of
dependencies") still works on the installed versions: an upgrade that moves one fails here,
by name, before a sweep measures anything with it."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

SECTION = "## Private uses of dependencies"


def private_uses_table() -> list[dict[str, str]]:
    """The rows of the architecture page's table of private uses, by column name."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True)) for line in lines[2:]]


def test_every_listed_use_names_where_it_is_and_a_test_that_exists():
    rows = private_uses_table()
    assert len(rows) >= 10
    for row in rows:
        for path in re.findall(r"`((?:orchestrator|tasks|scripts|hydra_plugins)/[\w/]+\.py)`", row["where"]):
            assert (ROOT / path).is_file(), f"{row['use']}: {path} is gone"
        tests = re.findall(r"`(tests/\w+\.py)`", row["test"])
        assert tests and all((ROOT / t).is_file() for t in tests), f"{row['use']}: no test named, or it is gone"


RAY_INIT_OPTIONS = ("_memory", "_node_ip_address", "_temp_dir")


def test_ray_init_still_takes_the_hidden_options_a_local_ray_starts_with():
    """ray.init refuses what it does not know before it starts anything: with one option of
    our own added, it must name that one alone."""
    source = (ROOT / "orchestrator" / "run" / "ray_session.py").read_text()
    assert set(re.findall(r"^\s+(_[a-z_]+)=", source, re.M)) == set(RAY_INIT_OPTIONS)  # this test covers each
    code = (
        "import ray\n"
        "try:\n"
        "    ray.init(address='local', _memory=2**30, _node_ip_address='127.0.0.1', _temp_dir='/nonexistent/x', _psw_probe=1)\n"
        "except RuntimeError as e:\n"
        "    print(e)\n"
        "print(ray.is_initialized())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.stdout.split("\n")[:2] == ["Unknown keyword argument(s): _psw_probe", "False"], out.stdout + out.stderr


def test_torch_dynamo_mark_dynamic_and_torch_check_are_there():
    pytest.importorskip("torch")
    import torch._dynamo

    t = torch.zeros(1, 2, 3, 4)
    torch._dynamo.mark_dynamic(t, 2)  # tasks/runtimes/compile.py: the KV cache's growing length
    torch._check(True)  # tasks/model/graphs.py: bounds of export's unbacked start position
    with pytest.raises(RuntimeError):
        torch._check(False)


def test_op_overloads_still_carry_their_qualified_name():
    """tasks/export/executorch.py reads `_name` of ATen and edge ops for the anatomy; it must
    equal the public name() ("aten::mul.Tensor"), or every op would be counted as plumbing."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("executorch")
    from executorch.exir.dialects._ops import ops as exir_ops

    for op in (torch.ops.aten.mul.Tensor, exir_ops.edge.aten.mul.Tensor):
        assert op._name == op.name() == "aten::mul.Tensor"


def test_tqdms_monitor_thread_is_ended_and_forgotten_as_tqdm_itself_does():
    """tasks/export/_xnnpack_patterns.py ends tqdm's monitor thread before the export server
    forks and sets tqdm.monitor to None, as tqdm does when its last bar closes; a later bar
    starts a new one."""
    import io

    tqdm = pytest.importorskip("tqdm").tqdm
    pytest.importorskip("executorch")
    from tasks.export._xnnpack_patterns import _end_tqdm_monitor

    assert tqdm.monitor_interval > 0
    bar = tqdm(total=2, file=io.StringIO(), mininterval=0)
    try:
        monitor = tqdm.monitor
        assert monitor is not None and callable(monitor.exit) and monitor.is_alive()
        _end_tqdm_monitor()
        assert tqdm.monitor is None and not monitor.is_alive()
    finally:
        bar.close()
    with tqdm(total=1, file=io.StringIO()) as again:
        assert tqdm.monitor is not None and tqdm.monitor is not monitor
        again.update()
