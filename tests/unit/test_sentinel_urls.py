"""``redis+sentinel://`` URLs: parsed without connecting, checked by df-config and the daemons'
preflight, and what the [redis] section adds (the sentinels' own user, wait_replicas)."""

import pytest

from dfpubsub.backends.access import RedisAccess
from dfpubsub.backends.urls import check_backend_url, parse_sentinel
from dfpubsub.config import load_settings
from dfpubsub.errors import ConfigError
from dfpubsub.plugins import parse_driver_url


def test_a_sentinel_url_names_the_sentinels_the_master_and_the_database():
    url = parse_sentinel("redis+sentinel://al%40ice:s3cret@h1:26379,h2,[::1]:26380/my%20master/3")
    assert url.sentinels == (("h1", 26379), ("h2", 26379), ("::1", 26380))
    assert (url.service, url.db, url.username, url.password, url.tls) == ("my master", 3, "al@ice", "s3cret", False)
    assert parse_sentinel("rediss+sentinel://h:1/m").tls and parse_sentinel("rediss+sentinel://h:1/m").db == 0


@pytest.mark.parametrize("url, why", [
    ("redis+sentinel://h1:26379", "names no master"),
    ("redis+sentinel://h1:26379/", "names no master"),
    ("redis+sentinel://h1:x/m/0", "must look like"),
    ("redis+sentinel://h1:0/m/0", "not between 1 and 65535"),
    ("redis+sentinel://h1:1,:2/m/0", "must look like"),
    ("redis+sentinel://u:hidden@h1:1/m/zero", "database 'zero' is not a number"),
])
def test_a_malformed_sentinel_url_is_a_config_error_without_its_password(url, why):
    with pytest.raises(ConfigError, match=why) as exc:
        check_backend_url(url, "store.url")
    assert "store.url" in str(exc.value) and "hidden" not in str(exc.value)


def test_every_backend_setting_takes_a_sentinel_url(tmp_path):
    url = "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster/0"
    for setting in ("store.url", "notify.url", "discovery.url", "leader.url"):
        check_backend_url(url, setting)
    assert parse_driver_url(url) == ("redis", url)  # the + belongs to Redis's scheme, not the driver's


def test_the_sentinels_take_their_own_user_and_the_same_tls(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("not read here")
    access = RedisAccess(username="app", password="pw", ca_file=str(ca), sentinel_username="sent",
                         sentinel_password="spw")
    parsed, master, sentinel = access.sentinel_args("redis+sentinel://u:urlpw@h:1/m/2")
    assert master["username"] == "app" and master["password"] == "pw" and master["db"] == 2  # [redis] wins
    assert sentinel["username"] == "sent" and sentinel["password"] == "spw"
    assert master["ssl"] and sentinel["ssl"] and master["ssl_ca_certs"] == sentinel["ssl_ca_certs"] == str(ca)
    _, master, sentinel = RedisAccess().sentinel_args("redis+sentinel://u:urlpw@h:1/m")
    assert (master["username"], master["password"]) == ("u", "urlpw") and "username" not in sentinel
    assert "ssl" not in master and "ssl" not in sentinel


def test_redis_settings_carry_the_sentinel_password_file_and_wait_replicas(tmp_path, redis_settings):
    secret = tmp_path / "sentinel.pw"
    secret.write_text("from-file\n")
    settings = load_settings(overrides={"redis": {"sentinel_password_file": str(secret), "wait_replicas": 1,
                                                  "wait_timeout": 0.5}})
    access = settings.redis.access()
    assert (access.sentinel_password, access.wait_replicas, access.wait_timeout) == ("from-file", 1, 0.5)
    with pytest.raises(ConfigError, match="wait_replicas"):
        load_settings(overrides={"redis": {"wait_replicas": -1}})
    with pytest.raises(ConfigError, match="sentinel_password_file"):
        load_settings(overrides={"redis": {"sentinel_password_file": str(tmp_path / "missing")}})


def test_refusals_that_wrote_nothing_are_told_from_other_errors():
    redis_exceptions = pytest.importorskip("redis.exceptions")
    from dfpubsub.backends.redis_scripts import refused

    parse = redis_exceptions  # the classes redis-py's parser makes of each error reply
    assert refused(parse.ReadOnlyError("You can't write against a read only replica."))
    assert refused(parse.MasterDownError("Link with MASTER is down and replica-serve-stale-data is set to 'no'."))
    assert refused(parse.ResponseError("NOREPLICAS Not enough good replicas to write."))
    assert not refused(parse.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"))
    assert not refused(parse.ConnectionError("Connection closed by server."))
