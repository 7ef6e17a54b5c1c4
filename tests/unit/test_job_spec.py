"""The job spec (DESIGN §4): defaults, every rule with the field named, and the original body."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from paddlecloud.common.web import validation_problem
from paddlecloud.jobs.spec import MAX_NAME_LENGTH, JobSpec, parse_submission

BASE = {"name": "fit-a-line", "package": "jobs/fit-a-line"}


def problems(body: Any) -> dict[str, str]:
    """The field → message list the service would send, as a dict (fields are unique here)."""
    with pytest.raises(ValidationError) as info:
        parse_submission(body)
    errors = validation_problem(info.value).errors
    assert errors is not None
    fields = [e["field"] for e in errors]
    assert len(fields) == len(set(fields)), errors
    return {e["field"]: e["message"] for e in errors}


def only_problem(**fields: Any) -> tuple[str, str]:
    found = problems({**BASE, **fields})
    assert len(found) == 1, found
    return next(iter(found.items()))


def test_defaults() -> None:
    spec = parse_submission(BASE)
    assert spec.to_dict() == {
        "name": "fit-a-line",
        "package": "jobs/fit-a-line",
        "entry": "python train.py",
        "psentry": None,
        "image": None,
        "registry": None,
        "trainers": 1,
        "pservers": 0,
        "cpu": "1",
        "gpu": 0,
        "memory": "1Gi",
        "pscpu": "1",
        "psmemory": "1Gi",
        "disk": "1Gi",
        "passes": None,
        "topology": None,
        "env": {},
        "datacenter": None,
        "input": None,
        "output": None,
        "max_restarts": 0,
    }
    assert (spec.cpu_milli, spec.memory_bytes, spec.pscpu_milli, spec.psmemory_bytes) == (
        1000,
        2**30,
        1000,
        2**30,
    )


FULL = {
    "name": "ctr.v2-run1",
    "package": "/pfs/dc1/home/alice/ctr.tar.gz",
    "entry": "python train.py --epochs 3",
    "psentry": "python serve.py",
    "image": "registry.example.com/team/paddle:2.6-gpu",
    "registry": "team-registry",
    "trainers": 4,
    "pservers": 2,
    "cpu": "500m",
    "gpu": 1,
    "memory": "512Mi",
    "pscpu": 2,
    "psmemory": "1.5Gi",
    "disk": "20Gi",
    "passes": 10,
    "env": {"GLOG_v": "3", "_LIB": "x=1"},
    "datacenter": "dc1",
    "input": "data/train",
    "output": "/pfs/dc1/home/alice/out",
    "max_restarts": 3,
}


def test_every_field_is_kept_with_the_users_spelling_and_normalised_accessors() -> None:
    spec = parse_submission(FULL)
    assert spec.to_dict() == FULL | {"topology": None}
    assert (spec.cpu_milli, spec.memory_bytes, spec.pscpu_milli, spec.psmemory_bytes) == (
        500,
        512 * 2**20,
        2000,
        3 * 2**29,
    )
    assert spec.disk_bytes == 20 * 2**30


def test_round_trip_gives_an_equal_spec() -> None:
    for body in (BASE, FULL, {"job_package": "p", "parallelism": 3, "name": "old", "topology": "t"}):
        spec = parse_submission(body)
        assert JobSpec.model_validate(spec.to_dict()) == spec


def test_a_topology_is_the_script_that_runs_or_is_refused() -> None:
    """The original's `-t modules/train.py` runs that file; never accepted and left unused."""
    spec = parse_submission(BASE | {"topology": "modules/my train.py"})
    assert (spec.entry, spec.topology) == ("python 'modules/my train.py'", "modules/my train.py")
    assert parse_submission(BASE | {"topology": "t.py", "entry": "python t.py"}).entry == "python t.py"
    for body, words in (
        (BASE | {"topology": "t.py", "entry": "python other.py"}, "not both"),
        (BASE | {"topology": "../t.py"}, "within the package"),
        (BASE | {"topology": "/etc/t.py"}, "within the package"),
    ):
        with pytest.raises(ValidationError) as caught:
            parse_submission(body)
        (error,) = caught.value.errors()
        assert error["loc"] == ("topology",) and words in error["msg"], error


def test_spec_is_frozen() -> None:
    spec = parse_submission(BASE)
    with pytest.raises(ValidationError):
        spec.trainers = 3  # type: ignore[misc]


# --- names -----------------------------------------------------------------------------

NAME_RULE = "may contain only lowercase letters, digits, '-' and '.', starting with a letter"


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("fit_a_line", "'_' is not allowed"),
        ("Fit", "'F' is not allowed (names are lowercase)"),
        ("a b", "' ' is not allowed"),
        (
            "9lives",
            "it starts with '9': the job's Kubernetes Service is named after it and must start with a letter",
        ),
        ("-a", "starts with '-'"),
        ("a-", "each part between dots must start and end with a letter or digit"),
        ("a..b", "each part between dots"),
        ("a.-b", "each part between dots"),
        ("", "it is empty"),
        ("a" * (MAX_NAME_LENGTH + 1), f"it is {MAX_NAME_LENGTH + 1} characters long"),
        ("kube-root-ca.crt", "are Kubernetes' and PaddleCloud's own (kube-root-ca.crt is in every"),
        ("paddlecloud-quota", "names starting with 'kube-' or 'paddlecloud-'"),
    ],
)
def test_bad_names_say_which_characters_are_allowed(name: str, why: str) -> None:
    field, message = only_problem(name=name)
    assert field == "name"
    assert f"{name!r} {NAME_RULE}" in message
    assert f"at most {MAX_NAME_LENGTH} characters" in message
    assert why in message


def test_longest_name_fits_the_kubernetes_names_derived_from_it() -> None:
    name = "a" * MAX_NAME_LENGTH
    assert parse_submission({**BASE, "name": name}).name == name
    # StatefulSet <name>-pserver plus '-' and a 10-character revision hash is a label value.
    assert len(f"{name}-pserver") + 1 + 10 <= 63
    assert MAX_NAME_LENGTH == 44


@pytest.mark.parametrize("name", ["a", "a1", "fit-a-line", "ctr.v2", "x9.y-z"])
def test_good_names(name: str) -> None:
    assert parse_submission({**BASE, "name": name}).name == name


def test_name_and_package_are_required() -> None:
    found = problems({})
    assert found == {"name": "Field required", "package": "Field required"}


# --- quantities ------------------------------------------------------------------------


def test_memory_with_an_unknown_suffix_lists_the_suffixes() -> None:
    field, message = only_problem(memory="1GB")
    assert field == "memory"
    assert message.startswith("'1GB' has unknown suffix 'GB'; use Ki, Mi, Gi")
    assert "k, M, G" in message


@pytest.mark.parametrize("field", ["cpu", "pscpu"])
@pytest.mark.parametrize(
    ("value", "rule"),
    [
        ("lots", "is not a quantity such as 2, 500m or 1Gi"),
        ("2cores", "unknown suffix 'cores'; use Ki"),
        ("0", "must be more than 0"),
        (0, "must be more than 0"),
        ("0.0001", "finer than 1m"),
        ("-1", "is not a quantity"),
        (True, "expected a quantity such as 500m or 2"),
        (None, "expected a quantity"),
        ([1], "expected a quantity"),
    ],
)
def test_bad_cpu(field: str, value: Any, rule: str) -> None:
    got_field, message = only_problem(**{field: value})
    assert got_field == field
    assert rule in message


@pytest.mark.parametrize("field", ["memory", "psmemory", "disk"])
@pytest.mark.parametrize(
    ("value", "rule"),
    [
        ("1GB", "unknown suffix 'GB'"),
        ("lots", "is not a quantity"),
        ("1024", "at least 16Mi; a bare number is bytes: did you mean '1024Mi'?"),
        (512, "did you mean '512Mi'?"),
        ("1Mi", "at least 16Mi"),
        ("0", "is too small"),
        (1.5, "whole number of bytes"),
        (True, "expected a quantity"),
    ],
)
def test_bad_memory(field: str, value: Any, rule: str) -> None:
    got_field, message = only_problem(**{field: value})
    assert got_field == field
    assert rule in message


def test_memory_without_a_hint_when_zero() -> None:
    assert "did you mean" not in only_problem(memory="0")[1]


@pytest.mark.parametrize(("cpu", "milli"), [("500m", 500), (2, 2000), (0.25, 250), ("1.5", 1500)])
def test_cpu_spellings(cpu: Any, milli: int) -> None:
    spec = parse_submission({**BASE, "cpu": cpu, "pscpu": cpu})
    assert (spec.cpu, spec.cpu_milli, spec.pscpu_milli) == (cpu, milli, milli)


@pytest.mark.parametrize(("memory", "size"), [("1G", 10**9), ("512Mi", 2**29), (2**30, 2**30)])
def test_memory_spellings(memory: Any, size: int) -> None:
    spec = parse_submission({**BASE, "memory": memory, "psmemory": memory})
    assert (spec.memory, spec.memory_bytes, spec.psmemory_bytes) == (memory, size, size)


# --- counts: strict integers within bounds ---------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "rule"),
    [
        ("trainers", 0, "greater than or equal to 1"),
        ("trainers", 1001, "less than or equal to 1000"),
        ("trainers", "2", "valid integer"),
        ("trainers", 2.0, "valid integer"),
        ("trainers", True, "valid integer"),
        ("pservers", -1, "greater than or equal to 0"),
        ("pservers", 1001, "less than or equal to 1000"),
        ("pservers", "1", "valid integer"),
        ("gpu", -1, "greater than or equal to 0"),
        ("gpu", "1", "valid integer"),
        ("passes", 0, "greater than or equal to 1"),
        ("passes", "3", "valid integer"),
        ("max_restarts", -1, "greater than or equal to 0"),
        ("max_restarts", 101, "less than or equal to 100"),
        ("max_restarts", "1", "valid integer"),
    ],
)
def test_bad_counts(field: str, value: Any, rule: str) -> None:
    got_field, message = only_problem(**{field: value})
    assert got_field == field
    assert rule in message


# --- strings and paths -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "rule"),
    [
        ("entry", "", "must not be empty"),
        ("entry", "   ", "must not be empty"),
        ("entry", "python\x00x", "NUL"),
        ("entry", ["python", "train.py"], "valid string"),
        ("package", "", "a PFS path is required"),
        ("package", "/etc/passwd", "absolute PFS paths start with /pfs/<datacenter>/"),
        ("package", "a\nb", "control characters"),
        ("package", "x" * 4097, "at most 4096"),
        ("input", "/data", "absolute PFS paths start with /pfs/"),
        ("output", "", "a PFS path is required"),
        ("image", "my image", "without spaces"),
        ("image", "", "must be non-empty"),
        ("registry", "", "must be non-empty"),
        ("topology", " ", "must not be empty"),
        ("datacenter", "dc/1", "may contain only letters, digits"),
        ("datacenter", "", "may contain only letters, digits"),
        ("name", 7, "valid string"),
    ],
)
def test_bad_strings(field: str, value: Any, rule: str) -> None:
    got_field, message = only_problem(**{field: value})
    assert got_field == field
    assert rule in message


def test_package_is_required_and_kept_unresolved() -> None:
    spec = parse_submission({"name": "a", "package": "../shared/pkg"})
    assert spec.package == "../shared/pkg"  # resolution and authorisation happen at submit


# --- env -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "rule"),
    [
        ("1X", "'1X' is not an environment variable name: use letters, digits and '_'"),
        ("A-B", "'A-B' is not an environment variable name"),
        ("", "'' is not an environment variable name"),
        ("PADDLE_TRAINER_ID", "'PADDLE_TRAINER_ID' cannot be set: it is set by PaddleCloud"),
        ("PADDLE_CLOUD_INPUT", "'PADDLE_CLOUD_INPUT' cannot be set: it is set by PaddleCloud"),
        ("TRAINING_ROLE", "'TRAINING_ROLE' cannot be set: it is set by PaddleCloud"),
        ("MASTER_ADDR", "'MASTER_ADDR' cannot be set"),
        ("RANK", "'RANK' cannot be set"),
        ("LOCAL_WORLD_SIZE", "'LOCAL_WORLD_SIZE' cannot be set"),
        ("POD_IP", "'POD_IP' cannot be set"),
        ("NAMESPACE", "'NAMESPACE' cannot be set"),
    ],
)
def test_bad_env_keys_are_named_with_the_reason(key: str, rule: str) -> None:
    field, message = only_problem(env={"OK": "1", key: "v"})
    assert field == "env"
    assert rule in message
    assert "OK" not in message


def test_every_bad_env_key_is_reported_at_once() -> None:
    _, message = only_problem(env={"RANK": "0", "a-b": "1"})
    assert "'RANK'" in message and "'a-b'" in message


@pytest.mark.parametrize(
    ("env", "rule"),
    [
        ({"X": 1}, "valid string"),
        ({"X": None}, "valid string"),
        ({"X": "a\x00b"}, "value of 'X' must not contain a NUL"),
        ({"X": "v" * 131072}, "value of 'X' is too long"),
        (["X=1"], "valid dictionary"),
    ],
)
def test_bad_env_values(env: Any, rule: str) -> None:
    found = problems({**BASE, "env": env})
    assert any(field.startswith("env") and rule in message for field, message in found.items()), found


def test_paddle_names_the_contract_does_not_set_are_the_users() -> None:
    # Paddle's own settings, which only the user can choose (issue 27: --env
    # PADDLE_DISTRI_BACKEND=gloo was refused with every other PADDLE_* name).
    env = {"PADDLE_DISTRI_BACKEND": "gloo", "GLOO_SOCKET_IFNAME": "eth1", "PADDLE_WITH_GLOO": "1"}
    assert parse_submission({**BASE, "env": env}).env == env


def test_env_names_that_only_resemble_reserved_ones_are_allowed() -> None:
    env = {"paddle_x": "1", "MY_RANK": "2", "TRAINER": "3", "PADDLEX": "4"}
    assert parse_submission({**BASE, "env": env}).env == env


# --- the body as a whole ---------------------------------------------------------------


def test_unknown_fields_are_refused() -> None:
    found = problems({**BASE, "jobname": "x", "parallelizm": 2})
    assert found == {"jobname": "unknown field", "parallelizm": "unknown field"}


@pytest.mark.parametrize("body", [[BASE], "job", None, 3])
def test_the_body_must_be_an_object(body: Any) -> None:
    assert problems(body) == {"(body)": "the body must be a JSON object"}


def test_original_body_is_accepted() -> None:
    spec = parse_submission({"name": "mnist", "job_package": "/pfs/dc1/home/a/mnist", "parallelism": 3})
    assert (spec.package, spec.trainers) == ("/pfs/dc1/home/a/mnist", 3)
    original = parse_submission({"name": "v1", "job_package": "p", "topology": "settings(batch_size=1)"})
    assert original.topology == "settings(batch_size=1)"
    stored = original.to_dict()
    assert "job_package" not in stored and "parallelism" not in stored
    assert stored["package"] == "p"


def test_errors_name_the_field_as_the_user_spelled_it() -> None:
    found = problems({"name": "a", "job_package": "/etc", "parallelism": "2"})
    assert set(found) == {"job_package", "parallelism"}
    assert "valid integer" in found["parallelism"]
    assert "absolute PFS paths start with /pfs/" in found["job_package"]
    assert "valid integer" in problems({**BASE, "trainers": "2"})["trainers"]


@pytest.mark.parametrize(
    ("body", "field", "both"),
    [
        ({**BASE, "trainers": 2, "parallelism": 2}, "parallelism", ("'trainers'", "'parallelism'")),
        ({"name": "a", "package": "p", "job_package": "p"}, "job_package", ("'package'", "'job_package'")),
    ],
)
def test_both_spellings_of_one_field_are_refused(
    body: dict[str, Any], field: str, both: tuple[str, str]
) -> None:
    found = problems(body)
    assert list(found) == [field]
    assert "not both" in found[field]
    assert all(name in found[field] for name in both)


def test_both_spellings_refused_alongside_other_errors() -> None:
    found = problems({"name": "a_b", "package": "p", "job_package": "q", "trainers": 0})
    assert set(found) == {"job_package", "name", "trainers"}


def test_validation_problem_summary_reads_field_then_rule() -> None:
    with pytest.raises(ValidationError) as info:
        parse_submission({**BASE, "memory": "1GB"})
    assert validation_problem(info.value).detail.startswith(
        "memory: '1GB' has unknown suffix 'GB'; use Ki, Mi, Gi"
    )


def test_every_runtime_contract_variable_is_refused_in_env() -> None:
    from paddlecloud.jobs.contract import RESERVED_ENV

    for key in sorted(RESERVED_ENV):
        with pytest.raises(ValidationError) as info:
            JobSpec.model_validate({"name": "job", "package": "pkg", "env": {key: "x"}})
        assert key in str(info.value), key
