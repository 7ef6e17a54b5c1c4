"""The client config file and the token cache: parsing, validation messages, selection, safe writes."""

from __future__ import annotations

import json
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from paddlecloud.config import (
    CachedToken,
    ClientConfig,
    ConfigError,
    ConfigMissing,
    Datacenter,
    TokenCache,
    config_path,
    load_config,
    parse_config,
    save_config,
)

GOOD = """\
datacenters:
- name: datacenter1
  username: alice
  password: secret
  endpoint: http://127.0.0.1:8080/
- name: datacenter2
  username: bob
  password: "12345"
  endpoint: https://paddle.example.com
current-datacenter: datacenter1
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / ".paddle" / "config"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_documented_layout_parses(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD))
    assert config.names() == ["datacenter1", "datacenter2"]
    assert config.current_datacenter == "datacenter1"
    first = config.select()
    # A trailing slash is dropped so that URLs are joined one way only.
    assert (first.username, first.password, first.endpoint) == ("alice", "secret", "http://127.0.0.1:8080")
    assert "secret" not in repr(first)


def test_missing_file_says_where_and_how_to_create_it(tmp_path: Path) -> None:
    path = tmp_path / ".paddle" / "config"
    with pytest.raises(ConfigMissing) as caught:
        load_config(path)
    message = str(caught.value)
    assert str(path) in message
    assert "paddlecloud config add" in message
    assert "\n" not in message


def test_bad_yaml_names_the_file_and_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "datacenters:\n- name: a\n  username: [unclosed\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: not valid YAML at line ")
    assert "\n" not in message


def test_unknown_current_datacenter_is_named_with_the_known_ones(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("current-datacenter: datacenter1", "current-datacenter: nowhere"))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert str(path) in message
    assert "current-datacenter 'nowhere'" in message
    assert "datacenter1, datacenter2" in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "the file is empty"),
        ("- just a list\n", "expected a mapping"),
        ("current-datacenter: x\n", "key `datacenters` is missing"),
        ("datacenters: []\n", "`datacenters` must be a non-empty list"),
        (GOOD.replace("  endpoint: https://paddle.example.com\n", ""), "datacenters[1].endpoint is missing"),
        (GOOD.replace('password: "12345"', "password: 12345"), "datacenters[1].password must be a string"),
        (GOOD.replace("http://127.0.0.1:8080/", "127.0.0.1:8080"), "datacenters[0].endpoint must be an http"),
        (GOOD.replace("current-datacenter:", "current_datacenter:"), "unknown key 'current_datacenter'"),
        (
            GOOD.replace("  username: bob\n", "  username: bob\n  user: bob\n"),
            "datacenters[1]: unknown key 'user'",
        ),
        (GOOD.replace("name: datacenter2", "name: datacenter1"), "'datacenter1' appears more than once"),
    ],
)
def test_invalid_configs_name_the_key_and_the_file(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ")
    assert expected in message
    assert "\n" not in message


def test_selection_by_flag_by_current_and_by_being_the_only_one(tmp_path: Path) -> None:
    config = parse_config(GOOD, tmp_path / "c")
    assert config.select().name == "datacenter1"
    assert config.select("datacenter2").username == "bob"
    with pytest.raises(ConfigError, match="there is no datacenter 'dc9'"):
        config.select("dc9")

    only = parse_config(GOOD.split("- name: datacenter2")[0], tmp_path / "c")
    assert only.select().name == "datacenter1"

    two_without_current = parse_config(GOOD.replace("current-datacenter: datacenter1\n", ""), tmp_path / "c")
    with pytest.raises(ConfigError, match="current-datacenter is not set"):
        two_without_current.select()


def test_config_location_flag_then_environment_then_home(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path / "home"), "PADDLE_CONFIG": str(tmp_path / "elsewhere.yaml")}
    assert config_path(env, str(tmp_path / "flag.yaml")) == tmp_path / "flag.yaml"
    assert config_path(env) == tmp_path / "elsewhere.yaml"
    assert config_path({"HOME": str(tmp_path / "home")}) == tmp_path / "home" / ".paddle" / "config"
    assert config_path({"HOME": str(tmp_path), "PADDLE_CONFIG": "~/x.yaml"}) == tmp_path / "x.yaml"


def test_save_writes_0600_atomically_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "fresh" / ".paddle" / "config"
    config = ClientConfig(path=path).with_datacenter(
        Datacenter("dc1", "alice", "s3cret", "http://127.0.0.1:1"), make_current=False
    )
    config = config.with_datacenter(Datacenter("dc2", "bob", "pw", "http://127.0.0.1:2"))
    save_config(config)
    assert mode_of(path) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["config"]  # no temporary file left
    again = load_config(path)
    assert again == config
    assert again.current_datacenter == "dc1"  # the first one added became current

    replaced = again.with_datacenter(
        Datacenter("dc1", "alice", "new", "http://127.0.0.1:1"), make_current=True
    )
    save_config(replaced.with_current("dc2"))
    final = load_config(path)
    assert [dc.password for dc in final.datacenters] == ["new", "pw"]
    assert final.current_datacenter == "dc2"


def test_tokens_are_kept_per_datacenter_and_user_in_a_0600_file(tmp_path: Path) -> None:
    cache = TokenCache(tmp_path / ".paddle" / "tokens.json")
    cache.put("dc1", "alice", CachedToken("t-alice-1", None, "http://h1"))
    cache.put("dc1", "bob", CachedToken("t-bob-1", None, "http://h1"))
    cache.put("dc2", "alice", CachedToken("t-alice-2", None, "http://h2"))
    assert mode_of(cache.path) == 0o600
    fresh = TokenCache(cache.path)  # read back from the file, not from memory
    assert fresh.get("dc1", "alice") == CachedToken("t-alice-1", None, "http://h1")
    assert fresh.get("dc1", "bob").token == "t-bob-1"  # type: ignore[union-attr]
    assert fresh.get("dc2", "alice").token == "t-alice-2"  # type: ignore[union-attr]
    assert fresh.get("dc2", "bob") is None

    assert fresh.discard("dc1", "alice") is True
    assert fresh.discard("dc1", "alice") is False
    assert fresh.get("dc1", "alice") is None
    assert fresh.get("dc1", "bob") is not None
    assert mode_of(cache.path) == 0o600


def test_expired_tokens_and_tokens_of_another_endpoint_are_not_used(tmp_path: Path) -> None:
    now = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    cache = TokenCache(tmp_path / "tokens.json", clock=lambda: now)
    cache.put("dc", "old", CachedToken("t1", (now - timedelta(minutes=1)).isoformat(), "http://h"))
    cache.put("dc", "fresh", CachedToken("t2", (now + timedelta(hours=1)).isoformat(), "http://h"))
    assert cache.get("dc", "old") is None
    assert cache.get("dc", "fresh", "http://h/").token == "t2"  # type: ignore[union-attr]
    # A bearer token is never offered to a server other than the one that issued it.
    assert cache.get("dc", "fresh", "http://other") is None

    slot = cache.slot("dc", "fresh", "http://other")
    assert slot.load() is None
    slot.store("t3", None)
    assert cache.get("dc", "fresh", "http://other").token == "t3"  # type: ignore[union-attr]


def test_a_damaged_cache_costs_a_login_not_a_failure(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text("{not json")
    cache = TokenCache(path)
    assert cache.get("dc", "alice") is None
    cache.put("dc", "alice", CachedToken("t", None, None))
    assert json.loads(path.read_text())["tokens"]["dc"]["alice"]["token"] == "t"
