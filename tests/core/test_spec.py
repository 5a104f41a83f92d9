"""Task spec validation: every bad input names the field and the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from autodl.errors import SpecError
from autodl.spec import load_spec, parse_spec


def write(tmp_path, text, name="spec.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_example_spec_loads_and_resolves_its_script():
    from autodl.config import include_dir

    spec = load_spec(include_dir() / "specs" / "simple_cnn.yaml")
    assert spec.task.batch_size_per_gpu == 64
    assert spec.resource_policy.memory_threshold == 0.85
    assert spec.scheduler.algorithm == "rule_based"
    assert spec.launcher.type == "local"
    assert spec.script_path() == (include_dir() / "scripts" / "simple_cnn.py").resolve()


def test_defaults_when_sections_absent(tmp_path):
    spec = load_spec(write(tmp_path, "task: {script: x.py}\n"))
    assert spec.resource_policy.memory_threshold == 0.85
    assert spec.task.num_gpus_estimate == "auto"
    assert spec.scheduler.timeout == 3600


def test_unknown_key_is_named_with_file(tmp_path):
    p = write(tmp_path, "task:\n  batch_sise_per_gpu: 32\n")
    with pytest.raises(SpecError) as exc:
        load_spec(p)
    msg = str(exc.value)
    assert "task.batch_sise_per_gpu" in msg and str(p) in msg and "unknown key" in msg


@pytest.mark.parametrize("value", ["0", "1.5", "-0.1"])
def test_threshold_outside_0_1_is_rejected(tmp_path, value):
    p = write(tmp_path, f"resource_policy:\n  memory_threshold: {value}\n")
    with pytest.raises(SpecError, match="resource_policy.memory_threshold"):
        load_spec(p)


def test_threshold_of_one_is_allowed(tmp_path):
    assert load_spec(write(tmp_path, "resource_policy: {memory_threshold: 1}\n")).resource_policy.memory_threshold == 1


def test_wrong_type_names_field_and_value(tmp_path):
    p = write(tmp_path, "task:\n  batch_size_per_gpu: lots\n")
    with pytest.raises(SpecError, match=r"task.batch_size_per_gpu.*'lots'"):
        load_spec(p)


def test_unknown_algorithm_names_the_field_and_the_registered_policies(tmp_path):
    """scheduler.algorithm is checked against the policy registry (autodl.policy.registry), not a list of its own."""
    assert load_spec(write(tmp_path, "scheduler: {algorithm: rl_based}\n")).scheduler.algorithm == "rl_based"
    with pytest.raises(SpecError, match=r"scheduler.algorithm.*'rule_basd'.*rl_based, rule_based"):
        load_spec(write(tmp_path, "scheduler: {algorithm: rule_basd}\n"))


def test_num_gpus_auto_or_positive_int(tmp_path):
    assert load_spec(write(tmp_path, "task: {num_gpus_estimate: 2}\n")).task.num_gpus_estimate == 2
    with pytest.raises(SpecError, match="num_gpus_estimate"):
        load_spec(write(tmp_path, "task: {num_gpus_estimate: 0}\n"))


def test_missing_script_is_named(tmp_path):
    spec = load_spec(write(tmp_path, "task: {script: nowhere.py}\n"))
    with pytest.raises(SpecError, match=r"task.script.*nowhere.py.*does not exist"):
        spec.script_path()


def test_no_script_anywhere(tmp_path):
    spec = load_spec(write(tmp_path, "task: {type: training}\n"))
    with pytest.raises(SpecError, match="task.script.*--script"):
        spec.script_path()


def test_cli_script_overrides_spec(tmp_path):
    (tmp_path / "a.py").write_text("")
    (tmp_path / "b.py").write_text("")
    spec = load_spec(write(tmp_path, "task: {script: a.py}\n"))
    assert spec.script_path(tmp_path / "b.py").name == "b.py"


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(SpecError, match="not found"):
        load_spec(tmp_path / "absent.yaml")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(write(tmp_path, "task: [unclosed\n"))
    with pytest.raises(SpecError, match="mapping"):
        parse_spec(["a", "b"], "list.yaml")


def test_launcher_shorthand():
    assert parse_spec({"launcher": "docker"}).launcher.type == "docker"
    with pytest.raises(SpecError, match="launcher"):
        parse_spec({"launcher": "slurm"})


def test_launcher_typo_is_rejected():
    with pytest.raises(SpecError, match="unknown key 'launcher.shm_sise'"):
        parse_spec({"launcher": {"type": "docker", "shm_sise": "8g"}})


@pytest.mark.parametrize("section, field, owner", [
    ({"type": "docker", "namespace": "team-a"}, "namespace", "kubernetes"),
    ({"type": "kubernetes", "mounts": [{"source": "/data", "target": "/d"}]}, "mounts", "docker"),
    ({"type": "local", "image": "paddle:3"}, "image", "docker"),
], ids=["namespace-under-docker", "mounts-under-kubernetes", "image-under-local"])
def test_a_field_of_another_launcher_is_refused_naming_the_launcher_that_has_it(section, field, owner):
    """The flat launcher section ignored a field its launcher does not read (``namespace`` meant nothing to
    Docker); each launcher's options are now their own model, and the error says whose field it is."""
    with pytest.raises(SpecError) as err:
        parse_spec({"launcher": section})
    assert str(err.value) == (f"<spec>: unknown key 'launcher.{field}'; it is a field of the {owner} launcher, not "
                              f"of {section['type']}: set launcher.type: {owner}, or remove it.")


def test_each_launcher_type_gets_its_own_options_and_keeps_unknown_keys_refused():
    from autodl.launch.options import DockerOptions, KubernetesOptions, LocalOptions

    assert isinstance(parse_spec({"launcher": "local"}).launcher, LocalOptions)
    assert isinstance(parse_spec({"launcher": {"type": "docker", "mounts": []}}).launcher, DockerOptions)
    assert isinstance(parse_spec({"launcher": {"type": "kubernetes", "namespace": "a"}}).launcher, KubernetesOptions)
    with pytest.raises(SpecError, match=r"unknown key 'launcher.gpu_memory'; remove it or check its spelling"):
        parse_spec({"launcher": {"type": "kubernetes", "gpu_memory": 1}})


def test_a_section_without_a_type_is_the_configured_launchers(monkeypatch):
    monkeypatch.setenv("AUTODL_LAUNCHER", "kubernetes")
    spec = parse_spec({"launcher": {"namespace": "team-a"}})
    assert spec.launcher.type == "kubernetes" and spec.launcher.namespace == "team-a"
    monkeypatch.delenv("AUTODL_LAUNCHER")
    assert parse_spec({}).launcher.type == "local"


def test_a_launcher_override_keeps_the_fields_the_new_launcher_has():
    """A DAG run's ``launcher`` Param re-types the section: what the new launcher reads is kept, what only the
    spec's launcher reads is dropped (it always ignored it)."""
    from autodl.launch.options import DockerOptions
    from autodl.steps.inputs import apply_overrides

    spec = parse_spec({"launcher": {"type": "kubernetes", "image": "paddle:3", "env": {"A": "1"}, "namespace": "t"}})
    docker = apply_overrides(spec, {"launcher": "docker"}).launcher
    assert isinstance(docker, DockerOptions)
    assert (docker.image, docker.env, docker.user) == ("paddle:3", {"A": "1"}, "1000:1000")
    local = apply_overrides(spec, {"launcher": "local"}).launcher
    assert local.type == "local" and local.env == {"A": "1"} and not hasattr(local, "image")


@pytest.mark.parametrize("text,field", [
    ("task: {batch_size_per_gpu: true}\n", "task.batch_size_per_gpu"),
    ("resource_policy: {memory_threshold: true}\n", "resource_policy.memory_threshold"),
    ("task: {input_shape: [3, 0, 32]}\n", "task.input_shape.1"),
    ("task: {input_shape: []}\n", "task.input_shape"),
])
def test_yaml_booleans_and_bad_shapes_are_spec_errors(tmp_path, text, field):
    with pytest.raises(SpecError, match=field.replace(".", r"\.")):
        load_spec(write(tmp_path, text))


def test_script_that_is_a_folder(tmp_path):
    (tmp_path / "code").mkdir()
    spec = load_spec(write(tmp_path, "task: {script: code}\n"))
    with pytest.raises(SpecError, match="is a folder, not a script"):
        spec.script_path()
    with pytest.raises(SpecError, match=r"^training script .* does not exist"):
        spec.script_path(tmp_path / "absent.py")


@pytest.mark.parametrize("data, said", [
    ({"task": {"batch_size_per_gpu": True}}, "field 'task.batch_size_per_gpu': expected a number, not true/false"),
    ({"task": {"model_name": True}}, "field 'task.model_name': expected a string, not true/false"),
    ({"task": {"batch_size_per_gpu": "64"}}, "(got '64'); write it without quotes: 64."),
    ({"launcher": {"env": {"HIDDEN": 64}}}, "field 'launcher.env.HIDDEN': Input should be a valid string (got 64); "
                                            "quote it in the YAML: '64'."),
    ({"launcher": {"type": "docker", "image": "x:1", "mounts": ["/data:/data"]}},
     "a mount is a mapping: {source: /data, target: /data, read_only: true}"),
    ({"launcher": {"type": "docker", "image": "x:1", "volumes": ["/data:/data"]}},
     "unknown key 'launcher.volumes' (did you mean 'mounts'?)"),
    ({"resource_policy": {"sharing": True}},
     "field 'resource_policy.sharing': expected one of 'exclusive', 'packed', not true/false"),
    # a fresh user (2026-12-07): these named the field but not how to write it
    ({"resource_policy": {"memory_threshold": "85%"}}, "(got '85%'); it is a fraction: 0.85 for 85%."),
    ({"resource_policy": {"memory_threshold": 85}}, "(got 85); it is a fraction: 0.85 for 85%."),
    ({"task": {"args": "--bs 128 --name 'my run'"}},
     'write it as a YAML list, one item each: ["--bs", "128", "--name", "my run"].'),
], ids=["bool-for-batch", "bool-for-name", "quoted-batch", "number-in-env", "docker-style-mount", "volumes-key",
        "bool-for-sharing", "percent-threshold", "threshold-as-percent", "args-as-one-string"])
def test_a_value_of_the_wrong_type_says_how_to_write_it(data, said):
    """A fresh user: `true` for the batch said "a number or a string", then "64" was refused; a number in
    launcher.env said only "a valid string"."""
    from autodl.errors import SpecError
    from autodl.spec import parse_spec

    with pytest.raises(SpecError) as exc:
        parse_spec(data)
    assert said in str(exc.value)


def test_sharing_in_a_spec_reads_as_the_setting_does_and_null_is_the_default(monkeypatch):
    """A fresh user: AUTODL_SHARING=PACKED worked but `sharing: Packed` in the spec was refused, and `sharing: null`
    too, though an absent sharing falls back to [autodl] sharing."""
    def sharing(value):
        return parse_spec({"resource_policy": {"sharing": value}}, Path("s.yaml")).resource_policy.sharing
    assert sharing("Packed") == sharing(" PACKED ") == "packed" and sharing("Exclusive") == "exclusive"
    monkeypatch.setenv("AUTODL_SHARING", "packed")
    assert sharing(None) == "packed"
    monkeypatch.setenv("AUTODL_SHARING", "exclusive")
    assert sharing(None) == "exclusive"


@pytest.mark.parametrize("mounts,says", [
    ([{"source": "/data/a", "target": "/in"}, {"source": "/data/a", "target": "/in2"}],
     "launcher.mounts.1.source: '/data/a' is already mounted (launcher.mounts.0)"),
    ([{"source": "/data/a", "target": "/in"}, {"source": "/data/b", "target": "/in/"}],
     "launcher.mounts.1.target: '/in/' is already a mount target (launcher.mounts.0)"),
    ([{"source": "/data/a", "target": "/workspace"}],
     "launcher.mounts.0.target: '/workspace' is already a mount target (launcher.code_dir, where the script is mounted)"),
    ([{"source": "/data/a", "target": "/autodl/hook", "read_only": False}],
     "launcher.mounts.0.target: '/autodl/hook' is in /autodl, autodl's own folder"),
])
def test_mounts_a_container_cannot_have_as_written_are_refused_naming_the_mount(mounts, says):
    """A fresh user's two mounts of one folder lost one silently (the engine's volumes are keyed by the host folder);
    a mount at the code folder or in autodl's own folder was accepted."""
    with pytest.raises(SpecError) as err:
        parse_spec({"launcher": {"type": "docker", "mounts": mounts}})
    assert says in str(err.value)


def test_two_sub_folders_of_one_host_folder_mount_side_by_side():
    spec = parse_spec({"launcher": {"type": "docker", "mounts": [{"source": "/data/a", "target": "/in/a"},
                                                                {"source": "/data/b", "target": "/in/b"}]}})
    assert [m.target for m in spec.launcher.mounts] == ["/in/a", "/in/b"]


def test_an_empty_section_is_that_sections_defaults(tmp_path):
    """A fresh user's spec with every key under ``resource_policy:`` and ``launcher:`` commented out (YAML's null)
    was refused: "Input should be a valid dictionary or instance of ResourcePolicySection (got None)"."""
    text = "task:\n  script: train.py\nresource_policy:\n  # memory_threshold: 0.9\nscheduler:\nlauncher:\n"
    spec = load_spec(write(tmp_path, text))
    defaults = parse_spec({"task": {"script": "train.py"}})
    assert spec.resource_policy == defaults.resource_policy and spec.scheduler == defaults.scheduler
    assert spec.launcher == defaults.launcher


@pytest.mark.parametrize("data, said", [
    ({"launcher": ["docker"]}, "field 'launcher': should be a launcher's name (local, docker, kubernetes) or a "
                               "mapping of that launcher's options"),
    ({"launcher": {"type": 3}}, "field 'launcher.type': a launcher's name: one of local, docker, kubernetes (got 3)"),
    ({"resource_policy": [1]}, "field 'resource_policy': should be a mapping: its keys as indented 'key: value' lines"),
    ({"launcher": {"env": "A=1"}}, "field 'launcher.env': should be a mapping"),
], ids=["launcher-list", "launcher-type-number", "section-list", "env-string"])
def test_a_section_that_is_no_mapping_says_what_it_may_be_not_a_class_name(data, said):
    """A fresh user's ``launcher: [docker]`` read "a valid dictionary or instance of LocalOptions", and
    ``launcher: {type: 3}`` read "Input should be 'local'", as if local were the only launcher."""
    with pytest.raises(SpecError) as exc:
        parse_spec(data, "spec.yaml")
    assert said in str(exc.value)
    assert "Options" not in str(exc.value) and "Section" not in str(exc.value)


def test_env_in_docker_composes_list_form_is_the_mapping_it_means():
    """``env: [A=1, B=x=y]`` (docker-compose's list form, which compose users write) was refused as "should be a
    mapping"; it means ``{A: '1', B: 'x=y'}``. An item without ``=`` (compose: take it from the host) and a name given
    twice are refused by name."""
    spec = parse_spec({"launcher": {"type": "docker", "env": ["A=1", "B=x=y", "EMPTY="]}})
    assert spec.launcher.env == {"A": "1", "B": "x=y", "EMPTY": ""}
    for items, said in ((["A=1", "HOME"], "'HOME' is not NAME=value"), (["A=1", "A=2"], "'A' is given twice"),
                        (["=1"], "'=1' is not NAME=value"), ([3], "3 is not NAME=value")):
        with pytest.raises(SpecError) as exc:
            parse_spec({"launcher": {"env": items}}, "spec.yaml")
        assert f"field 'launcher.env': {said}" in str(exc.value)


def test_no_script_and_no_spec_says_to_give_the_script_not_a_spec_field():
    """``autodl profile`` with no argument said "<spec>: field 'task.script' is missing" though no spec was given."""
    from autodl.spec import TaskSpec

    with pytest.raises(SpecError, match=r"^no training script was given: `autodl profile SCRIPT"):
        TaskSpec().script_path()


def test_a_device_name_short_of_the_catalogs_says_which_it_may_mean():
    """A fresh user's ``preferred_devices: [A100]``: the whole catalog was listed, not the two A100s."""
    from autodl.catalog import load_catalog
    from autodl.errors import SpecError
    from autodl.spec import check_spec_against_catalog, parse_spec

    spec = parse_spec({"resource_policy": {"preferred_devices": ["A100"]}})
    with pytest.raises(SpecError, match=r"'A100' is not in the GPU catalog \(did you mean A100-SXM4-40GB or "
                                        r"A100-SXM4-80GB\?\)"):
        check_spec_against_catalog(spec, load_catalog())


def test_a_python_file_given_as_the_spec_is_named_as_the_script_not_as_bad_yaml(tmp_path):
    """``autodl plan train.py`` said "not valid YAML ... fix the file (a YAML linter points at the line)"."""
    from autodl.errors import SpecError

    script = tmp_path / "train.py"
    script.write_text("import paddle\n")
    with pytest.raises(SpecError, match="is a Python file, not a task spec") as exc:
        load_spec(script)
    assert "YAML linter" not in str(exc.value)
