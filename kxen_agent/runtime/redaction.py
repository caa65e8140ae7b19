"""Redaction: what is taken out of every text a run persists, and the scan that finds what was not.

Pure functions over text (``objects_spec.md`` §14.11 states every rule and
its replacement text, with vectors the tests read from the spec): two
implementations that follow it redact alike. In order:

1. **Secret values**: the value of each environment variable of the runner
   whose name looks like a credential (:func:`is_credential_name`) and that
   is at least :data:`MIN_ENV_SECRET` characters long, and the agent's API
   key (the value of its ``api_key_env``, at least :data:`MIN_KEY_SECRET`
   characters), longest first, become ``[REDACTED]``;
2. **private key blocks** (``-----BEGIN … PRIVATE KEY-----`` to its END
   line, or to the end of the text when the END line is cut off) keep their
   BEGIN and END lines, the key becomes ``[REDACTED]``;
3. **URL user-info** (``https://user:token@host``) becomes ``***``
   (``https://***@host``);
4. **token formats** (OpenAI and Anthropic ``sk-…``, GitHub ``ghp_`` …
   ``github_pat_``, AWS ``AKIA``/``ASIA``, Slack ``xox?-``) become
   ``[REDACTED]``.

:func:`redact` applies them (it is idempotent: redacted text redacts to
itself); :func:`find_secrets` reports what they would replace, as
:class:`Hit` records that never hold the secret, for ``bundle verify`` and
``session export --scan``. :func:`tool_environment` is the ``shell`` tool's
environment: credential-looking variables removed unless the agent's policy
keeps them (``env_keep``).

This module must never read a file, the store or the environment by itself:
callers pass the values (the runner reads its environment once per run).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

__all__ = [
    "CREDENTIAL_NAME",
    "Hit",
    "MIN_ENV_SECRET",
    "MIN_KEY_SECRET",
    "REDACTED",
    "TOKEN_RULES",
    "USERINFO_REDACTED",
    "credential_env_values",
    "find_secrets",
    "is_credential_name",
    "redact",
    "scan_value",
    "tool_environment",
]

REDACTED = "[REDACTED]"
USERINFO_REDACTED = "***"
#: The shortest value of a credential-looking variable that is redacted: a
#: shorter one ("1", "true") would shred the text and hide nothing.
MIN_ENV_SECRET = 8
#: The shortest API key value redacted (the agent names that variable).
MIN_KEY_SECRET = 4

#: A variable name that looks like a credential (searched, case-insensitive):
#: it holds KEY, SECRET, TOKEN, PASSWORD, PASSWD or CREDENTIAL, or ends in _PAT.
CREDENTIAL_NAME = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL|_PAT$", re.IGNORECASE)

# Every repetition that may fail after it is bounded: a text of 16 MiB (a task)
# is redacted in linear time. With ``*`` and ``+`` here, a run of letters made
# each start position scan to its end (20,000 letters took a second, 16 MiB
# would have taken days).
_PRIVATE_KEY = re.compile(r"-----BEGIN ([A-Z0-9 ]{0,64})PRIVATE KEY-----.*?(?:-----END \1PRIVATE KEY-----|\Z)",
                          re.DOTALL)
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]{0,31}://)([^\s/?#@]{1,256})@")

#: Literals every match of a rule holds: a text without them is skipped at C
#: speed (``in``), so scanning tool output and bundles costs little when, as
#: almost always, there is nothing to find (the regular expressions take
#: about 0.05 s per MB each; a 528 MB bundle holds many MB of text).
_ANCHORS: dict[str, tuple[str, ...]] = {
    "private-key": ("PRIVATE KEY-----",),
    "url-userinfo": ("://",),
    "sk-key": ("sk-",),
    "github-token": ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
    "github-pat": ("github_pat_",),
    "aws-key-id": ("AKIA", "ASIA"),
    "slack-token": ("xox",),
}


def _may_match(rule: str, text: str) -> bool:
    return any(a in text for a in _ANCHORS[rule])


#: (rule, what it looks like, pattern): the token formats, each redacted whole.
TOKEN_RULES: tuple[tuple[str, str, re.Pattern[str]], ...] = (
    ("sk-key", "an OpenAI or Anthropic API key (sk-...)", re.compile(r"(?<![A-Za-z0-9_-])sk-[A-Za-z0-9_-]{20,}")),
    ("github-token", "a GitHub token (ghp_, gho_, ghu_, ghs_, ghr_)",
     re.compile(r"(?<![A-Za-z0-9_])gh[pousr]_[A-Za-z0-9]{36,}")),
    ("github-pat", "a GitHub fine-grained token (github_pat_...)",
     re.compile(r"(?<![A-Za-z0-9_])github_pat_[A-Za-z0-9_]{22,}")),
    ("aws-key-id", "an AWS access key id (AKIA..., ASIA...)",
     re.compile(r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])")),
    ("slack-token", "a Slack token (xoxb-, xoxp-, ...)", re.compile(r"(?<![A-Za-z0-9])xox[abposr]-[A-Za-z0-9-]{10,}")),
)


def is_credential_name(name: str) -> bool:
    """Whether an environment variable's name looks like it holds a credential."""
    return CREDENTIAL_NAME.search(name) is not None


def credential_env_values(environ: Mapping[str, str]) -> list[str]:
    """The values (at least :data:`MIN_ENV_SECRET` characters) of the credential-looking variables of ``environ``."""
    return [v for k, v in environ.items() if len(v) >= MIN_ENV_SECRET and is_credential_name(k)]


def _secrets(secrets: Iterable[str]) -> list[str]:
    # Longest first, so a secret containing another is replaced whole.
    return sorted({s for s in secrets if s and len(s) >= MIN_KEY_SECRET}, key=len, reverse=True)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every secret value, private key, URL user-info and token replaced (§14.11).

    ``secrets`` are the values to take out verbatim (the API key and the
    credential-looking variables' values; shorter than :data:`MIN_KEY_SECRET`
    are left alone). Redacting redacted text changes nothing.
    """
    for secret in _secrets(secrets):
        text = text.replace(secret, REDACTED)
    if _may_match("private-key", text):
        text = _PRIVATE_KEY.sub(
            lambda m: f"-----BEGIN {m[1]}PRIVATE KEY-----{REDACTED}-----END {m[1]}PRIVATE KEY-----", text)
    if _may_match("url-userinfo", text):
        out, at = [], 0
        for m in _userinfo(text):
            out += [text[at : m.start()], m[1], USERINFO_REDACTED, "@"]
            at = m.end()
        text = "".join(out) + text[at:]
    for rule, _what, rx in TOKEN_RULES:
        if _may_match(rule, text):
            text = rx.sub(REDACTED, text)
    return text


_SCHEME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+.-")


def _userinfo(text: str) -> Iterator[re.Match[str]]:
    """``_USERINFO.finditer(text)``, the same matches, looked for only where a ``://`` is.

    Every match holds ``://`` (neither the scheme nor the user-info may hold
    ``:`` or ``/``) at most 32 characters after its start. ``finditer``
    would take, for each ``://``, the leftmost start within those 32 (and
    not before the previous match's end) from which scheme characters reach
    it and that is a letter: found here by walking back from the ``://``,
    then the pattern is tried there once (the user-info part is the same
    from any start). Trying the pattern at every position of a long text
    took 0.4 s per MB.
    """
    end = 0
    sep = text.find("://")
    while sep >= 0:
        low = max(end, sep - 32)
        k = sep
        while k > low and text[k - 1] in _SCHEME_CHARS:
            k -= 1
        while k < sep and not text[k].isascii() or k < sep and not text[k].isalpha():
            k += 1
        if k < sep:
            m = _USERINFO.match(text, k)
            if m is not None:
                yield m
                end = m.end()
        sep = text.find("://", max(sep + 1, end))


@dataclass(frozen=True)
class Hit:
    """Something :func:`redact` would replace: which rule, where, how long — never the text itself."""

    rule: str  # "secret-value", "private-key", "url-userinfo", or a TOKEN_RULES name
    what: str  # what it looks like, for a person
    start: int  # character offset in the text
    length: int  # in characters

    def describe(self) -> str:
        return f"{self.what} at character {self.start} ({self.length} characters)"


def find_secrets(text: str, secrets: Iterable[str] = ()) -> list[Hit]:
    """What :func:`redact` would replace in ``text``, by rule, in order of position.

    The rules are tried in :func:`redact`'s order and what one finds is
    masked from the next (a GitHub token that is also a variable's value is
    one hit, as it is one replacement). A private key block already
    redacted and user-info already ``***`` are no hits: a bundle of
    redacted runs scans clean.
    """
    hits: list[Hit] = []
    work = text

    def found(rule: str, what: str, start: int, length: int) -> None:
        nonlocal work
        hits.append(Hit(rule, what, start, length))
        work = work[:start] + "\0" * length + work[start + length:]  # offsets kept for the next rules

    for secret in _secrets(secrets):
        start = work.find(secret)
        while start >= 0:
            found("secret-value", "the value of a credential-looking environment variable", start, len(secret))
            start = work.find(secret, start + len(secret))
    if _may_match("private-key", work):
        for m in list(_PRIVATE_KEY.finditer(work)):
            if m[0] != f"-----BEGIN {m[1]}PRIVATE KEY-----{REDACTED}-----END {m[1]}PRIVATE KEY-----":
                found("private-key", "a private key block", m.start(), len(m[0]))
    if _may_match("url-userinfo", work):
        for m in list(_userinfo(work)):
            if m[2] != USERINFO_REDACTED:
                found("url-userinfo", "a URL with user-info (user:password@)", m.start(2), len(m[2]))
    for rule, what, rx in TOKEN_RULES:
        if _may_match(rule, work):
            for m in list(rx.finditer(work)):
                found(rule, what, m.start(), len(m[0]))
    return sorted(hits, key=lambda h: h.start)


def scan_value(value: object, secrets: Iterable[str] = ()) -> list[tuple[str, Hit]]:
    """Every hit in a decoded object's value, with where in the value: ``(path, hit)``.

    A blob's value (bytes) is read as UTF-8, invalid bytes replaced, its
    path ``blob``; in a structured value each text string is scanned, keys
    included (path ``key`` or ``toolCalls[0].arguments``; a key itself is
    ``<key name>``). Links (32-byte strings) are ids, not text.
    """
    found: list[tuple[str, Hit]] = []
    values = list(secrets)
    if isinstance(value, (bytes, bytearray)):
        return [("blob", h) for h in find_secrets(bytes(value).decode("utf-8", "replace"), values)]
    stack: list[tuple[str, object]] = [("", value)]
    while stack:
        path, v = stack.pop()
        if type(v) is str:
            found += [(path or "(text)", h) for h in find_secrets(v, values)]
        elif type(v) is dict:
            for k, x in reversed(list(v.items())):
                found += [(f"{path + '.' if path else ''}<key>", h) for h in find_secrets(k, values)]
                stack.append((f"{path + '.' if path else ''}{k}", x))
        elif type(v) is list:
            stack += [(f"{path}[{i}]", x) for i, x in reversed(list(enumerate(v)))]
    return found


def tool_environment(environ: Mapping[str, str], keep: tuple[str, ...] | None,
                     always_drop: Iterable[str] = ()) -> dict[str, str]:
    """The ``shell`` tool's environment: ``environ`` without its credential-looking variables.

    ``keep`` (the agent policy's ``env_keep``: names, ``*`` globs allowed)
    keeps the variables it names; None keeps every variable (a version-1
    agent lock, written before this rule: it keeps its meaning, §14.2).
    ``always_drop`` (the API key's variable) is dropped whatever ``keep`` says.
    """
    drop = set(always_drop)
    out = {}
    for name, value in environ.items():
        if name in drop:
            continue
        if keep is not None and is_credential_name(name) and not any(fnmatch.fnmatchcase(name, k) for k in keep):
            continue
        out[name] = value
    return out
