"""Git's config environment (``GIT_CONFIG_COUNT`` and its ``GIT_CONFIG_KEY_<n>``/``GIT_CONFIG_VALUE_<n>``) reaches
the ``shell`` tool whole: ``GIT_CONFIG_KEY_<n>`` names a config key, so it is not credential-looking (§14.11),
and a git the tool runs reads the user's entry."""

from __future__ import annotations

import subprocess

from kxen_agent.runtime import redaction as rd


def test_git_config_key_variables_are_not_credential_looking() -> None:
    assert not rd.is_credential_name("GIT_CONFIG_KEY_0") and not rd.is_credential_name("GIT_CONFIG_KEY_12")
    # Only that exact form: a key-holding variable of another name still is.
    for name in ("GIT_CONFIG_KEY_", "GIT_CONFIG_KEY_X", "MY_GIT_CONFIG_KEY_0", "GIT_CONFIG_KEY_0_TOKEN"):
        assert rd.is_credential_name(name), name


def test_the_shell_environment_keeps_the_users_git_config_entries() -> None:
    environ = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "kxen.test", "GIT_CONFIG_VALUE_0": "kept",
               "GITHUB_TOKEN": "ghp_notreallyasecret", "PATH": "/usr/bin:/bin"}
    env = rd.tool_environment(environ, keep=())
    assert "GITHUB_TOKEN" not in env
    got = subprocess.run(["git", "config", "kxen.test"], env=env, capture_output=True, text=True)
    assert (got.returncode, got.stdout) == (0, "kept\n"), got.stderr
    # Its value, a key's name, is no secret to redact.
    assert "kxen.test" not in rd.credential_env_values(environ)
