"""The one YAML loader and the file and script readers (autodl.inputs): bounded, plain, and refusing clearly."""

from __future__ import annotations

import time

import pytest

from autodl.config import read_yaml
from autodl.errors import ProfileError, SpecError
from autodl.inputs import MAX_YAML_NODES, compile_script, parse_yaml, read_script, read_text, short


def load(text: str):
    return parse_yaml(text, SpecError, "f.yaml")


def refused(text: str) -> str:
    with pytest.raises(SpecError) as info:
        load(text)
    return str(info.value)


@pytest.mark.parametrize("text, value", [
    ("a: 1", {"a": 1}),
    ("a: -3\nb: 0x1f\nc: 0\nd: 1_000", {"a": -3, "b": 31, "c": 0, "d": 1000}),  # 017 is refused (tests/core/test_hostile_cli_inputs.py)
    ("a: 1.5\nb: .5\nc: 1.0e+3", {"a": 1.5, "b": 0.5, "c": 1000.0}),
    ("a: yes\nb: off\nc: ~", {"a": True, "b": False, "c": None}),
    ("user: 1000:1000", {"user": "1000:1000"}),          # not YAML 1.1's base-60 integer 61000
    ("day: 2024-01-01", {"day": "2024-01-01"}),          # a date stays the string it was written as
    ("a: !!str 12", {"a": "12"}),
    ("a: 9223372036854775807", {"a": 2**63 - 1}),
    ("base: &b {x: 1, y: 2}\nc: {<<: *b, x: 3}", {"base": {"x": 1, "y": 2}, "c": {"x": 3, "y": 2}}),
    ("a: &x [1, 2]\nb: *x", {"a": [1, 2], "b": [1, 2]}),
    ("", None),
])
def test_plain_yaml_is_read(text, value):
    assert load(text) == value


@pytest.mark.parametrize("text, says", [
    ("a: !!python/object/apply:os.system ['true']", "f.yaml:1: a: the tag '!!python/object/apply:os.system' is not allowed"),
    ("a: !!python/name:os.system", "tag '!!python/name:os.system' is not allowed"),
    ("a: !custom 1", "tag '!custom' is not allowed"),
    ("a: !!binary aGk=", "tag '!!binary' is not allowed"),
    ("a: !!timestamp 2024-01-01", "tag '!!timestamp' is not allowed"),
    ("a: !!set {x}", "tag '!!set' is not allowed"),
    ("a: !!int 'x'", "f.yaml:1: a: 'x' is not an integer"),
    ("a: [1, {b: !!float q}]", "f.yaml:1: a[1].b: 'q' is not a number"),
    ("a: !!bool maybe", "'maybe' is not true or false"),
    ("a: " + "9" * 4301, "a: an integer of 4,301 digits is too large"),
    ("a: 9223372036854775808", "a: the integer 9223372036854775808 is too large"),
    ("a: .inf", "a: '.inf' is not a finite number"),
    ("a: -.Inf", "not a finite number"),
    ("a: .NaN", "not a finite number"),
    ("a: 1\nb: 2\na: 3", "f.yaml:3: a: duplicate key 'a' (first on line 1)"),
    ("t:\n  x: 1\n  x: 2", "f.yaml:3: t.x: duplicate key 'x' (first on line 2)"),
    ("{a: 1, a: 1}", "duplicate key 'a'"),
    ("[1, 2]: 3", "a key must be a plain value"),
    ("a: 1\n---\nb: 2", "expected a single document"),
    ("a: *nope", "undefined alias"),
    ("a: [1, 2", "not valid YAML"),
    ("a: \x07", "not valid YAML"),
])
def test_refused_yaml_names_line_and_field(text, says):
    assert says in refused(text)


def test_depth_is_bounded_in_flow_and_block_style():
    assert "nest" in refused("[" * 1000)
    assert "nested deeper than 64" in refused("a:\n" + "".join("  " * i + "- \n" for i in range(200)))
    assert "nested deeper than 64" in refused("".join("  " * i + "k:\n" for i in range(200)))


def test_billion_laughs_is_refused_quickly_and_briefly():
    levels = ["l0: &l0 ['lol', 'lol', 'lol', 'lol', 'lol', 'lol', 'lol', 'lol', 'lol']"]
    levels += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
    message = refused("\n".join(levels) + "\nargs: *l8\n")
    assert f"more than {MAX_YAML_NODES:,} values" in message and "lol" not in message and len(message) < 300


def test_a_document_of_many_plain_values_is_bounded_too():
    message = refused("[" + "1," * (MAX_YAML_NODES + 10) + "]")
    assert "more than" in message


def test_aliases_within_the_bound_are_fine():
    text = "l0: &l0 [a, b, c]\nl1: &l1 [*l0, *l0, *l0]\nl2: [*l1, *l1]\n"
    assert load(text)["l2"] == [[["a", "b", "c"]] * 3] * 2


def test_error_values_are_capped():
    message = refused("a: !!int '" + "x" * 10_000 + "'")
    assert len(message) < 300


def test_read_yaml_file_errors(tmp_path):
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe\x00task")
    with pytest.raises(SpecError, match="binary"):
        read_yaml(tmp_path / "bin.yaml", SpecError, "missing")
    (tmp_path / "latin1.yaml").write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(SpecError, match=r"not UTF-8 text \(byte 0xe9 at offset 9\)"):
        read_yaml(tmp_path / "latin1.yaml", SpecError, "missing")
    (tmp_path / "big.yaml").write_text("a: '" + "x" * (3 << 20) + "'\n")
    with pytest.raises(SpecError, match="larger than 2 MiB"):
        read_yaml(tmp_path / "big.yaml", SpecError, "missing")
    with pytest.raises(SpecError, match="nowhere.yaml: not here"):
        read_yaml(tmp_path / "nowhere.yaml", SpecError, "not here")
    (tmp_path / "bom.yaml").write_bytes(b"\xef\xbb\xbfa: 1\n")
    assert read_yaml(tmp_path / "bom.yaml", SpecError, "missing") == {"a": 1}


def test_paths_are_resolved_without_following_loops(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(SpecError, match="symlink loop"):
        read_text(tmp_path / "a", SpecError)
    with pytest.raises(SpecError, match="too long"):
        read_text(tmp_path / ("x" * 256), SpecError)
    with pytest.raises(SpecError, match="too long"):
        read_text("/" + "d/" * 3000 + "f", SpecError)
    with pytest.raises(SpecError, match="not a valid path"):
        read_text("a\x00b", SpecError)
    (tmp_path / "real.yaml").write_text("a: 1\n")
    (tmp_path / "link.yaml").symlink_to(tmp_path / "real.yaml")
    path, text = read_text(tmp_path / "link.yaml", SpecError)
    assert path == (tmp_path / "real.yaml").resolve() and text == "a: 1\n"


def test_the_shipped_files_still_read():
    from autodl.catalog import load_catalog
    from autodl.config import include_dir
    from autodl.inventory import read_inventory
    from autodl.spec import load_spec

    assert len(load_catalog().models) > 10
    for pool in sorted((include_dir() / "pools").glob("*.yaml")):
        if not pool.name.startswith("sim-"):
            assert read_inventory(pool).devices
    for spec in sorted((include_dir() / "specs").glob("*.yaml")):
        load_spec(spec)


def test_a_large_pool_reads_within_the_bounds(tmp_path, catalog):
    """10,000 declared devices (the size the bounds are chosen for) read, and in a few seconds at most."""
    from autodl.inventory import read_inventory

    lines = ["devices:"] + [f"  - {{index: {i % 64}, model: A100-SXM4-40GB, host: h{i // 64}}}" for i in range(10_000)]
    (tmp_path / "big.yaml").write_text("\n".join(lines) + "\n")
    start = time.monotonic()
    assert len(read_inventory(tmp_path / "big.yaml", catalog=catalog).devices) == 10_000
    assert time.monotonic() - start < 60  # generous: the point is "not minutes", on a shared 2-core machine


@pytest.mark.parametrize("source, says", [
    ("return 1\n", "x.py:1: syntax error: 'return' outside function"),
    ("def f(a, a):\n    pass\n", "x.py:1: syntax error: duplicate argument 'a'"),
    ("def f():\n    nonlocal q\n", "x.py:2: syntax error: no binding for nonlocal 'q' found"),
    ("nonlocal q\n", "x.py:1: syntax error: nonlocal declaration not allowed at module level"),
    ("for x in y:\n    pass\nbreak\n", "x.py:3: syntax error: 'break' outside loop"),
    ("x = (1 +\n", "x.py:1: syntax error"),
    ("x = " + "1 + " * 100_000 + "1\n", "too deeply for Python to compile"),
    ("a = 1\x00\n", "null bytes"),
])
def test_scripts_compile_as_python_would(source, says):
    with pytest.raises(ProfileError) as info:
        compile_script(source, ProfileError, "x.py")
    assert says in str(info.value) and len(str(info.value)) < 400


def test_valid_but_deep_script_gives_no_tree_not_an_error():
    tree = compile_script("x = " + "-" * 1000 + "1\n", ProfileError, "x.py")
    assert tree is None or tree.body


def test_read_script_refuses_binary_and_non_utf8(tmp_path):
    (tmp_path / "b.py").write_bytes(b"\x7fELF\x02\x01\x01\x00")
    with pytest.raises(ProfileError, match="binary"):
        read_script(tmp_path / "b.py", ProfileError)
    (tmp_path / "l.py").write_bytes("s = 'caf\xe9'\n".encode("latin-1"))
    with pytest.raises(ProfileError, match="not UTF-8"):
        read_script(tmp_path / "l.py", ProfileError)


def test_short_never_walks_a_whole_structure():
    nested: list = ["lol"] * 9
    for _ in range(12):
        nested = [nested] * 9  # 9**13 leaves if expanded
    start = time.monotonic()
    text = short(nested)
    assert len(text) <= 80 and time.monotonic() - start < 5
