"""Redaction: what is taken out of every text a run persists, and the scan that finds what was not.

Pure functions over text (``objects_spec.md`` §14.11 states every rule and
its replacement text, with vectors the tests read from the spec): two
implementations that follow it redact alike. In order:

1. **Secret values**: the value of each environment variable of the runner
   whose name looks like a credential (:func:`is_credential_name`) and that
   is at least :data:`MIN_ENV_SECRET` characters long, and the agent's API
   key (the value of its ``api_key_env``, at least :data:`MIN_KEY_SECRET`
   characters), longest first, become ``[REDACTED]``, then their
   percent- and base64-encoded forms (:func:`encoded_forms`);
2. **private key blocks** (``-----BEGIN … PRIVATE KEY-----`` to its END
   line, or to the end of the text when the END line is cut off) keep their
   BEGIN and END lines, the key becomes ``[REDACTED]``;
3. **URL user-info** (``https://user:token@host``) becomes ``***``
   (``https://***@host``);
4. **webhook and query secrets** (Slack and Discord webhook paths,
   ``?token=`` and its kin) and 5. **credential files and assignments**
   (``NAME=value`` lines whose name ends in a credential word, as ``env``
   and ``~/.aws/credentials`` print them; ``"password": "..."`` and
   docker's ``"auth"``; ``.netrc`` and ``.pgpass`` lines): the secret
   becomes ``[REDACTED]``, its name or host stays (:data:`CONTEXT_RULES`);
6. **token formats** (OpenAI and Anthropic ``sk-…``, GitHub ``ghp_`` …
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

import base64
import fnmatch
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

__all__ = [
    "ASSIGNMENT_NAME",
    "CONTEXT_RULES",
    "CREDENTIAL_NAME",
    "Hit",
    "MIN_ENV_SECRET",
    "MIN_KEY_SECRET",
    "REDACTED",
    "TOKEN_RULES",
    "USERINFO_REDACTED",
    "credential_env_values",
    "encoded_forms",
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
#: it holds KEY, SECRET, TOKEN, PASSWORD, PASSWD, PASSPHRASE, CREDENTIAL,
#: _PASS or _PWD (``DB_PASS``, ``MYSQL_PWD``; not ``PWD`` nor ``OLDPWD``, the
#: shell's directories), or ends in _PAT.
CREDENTIAL_NAME = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|_PASS|_PWD|_PAT$", re.IGNORECASE)

#: The name in ``name = value`` (and ``"name": "value"``) whose value is
#: redacted (rule 6): it *ends* in a credential word, so that
#: ``tokenizer``, ``key_id`` or ``api_key_env`` name no secret.
ASSIGNMENT_NAME = re.compile(r"(?:KEY|SECRET|TOKEN|PASSWORD|PASSWD|PASSPHRASE|CREDENTIALS?|[_.-]PASS|[_.-]PWD|_PAT)$",
                             re.IGNORECASE)

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
    "webhook-slack": ("hooks.slack.com/",),
    "webhook-discord": ("/api/webhooks/",),
    "url-query-secret": ("=",),
    "credential-assignment": ("=", ":"),
    "json-credential": ('"',),
    "netrc": ("password",),
    "pgpass": (":",),
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


def _is_assignment_name(name: str) -> bool:
    return ASSIGNMENT_NAME.search(name) is not None


def _literal_value(value: str) -> bool:
    """An unquoted value that is a literal, not a reference: ``$VAR``, ``self.token``, ``settings.SECRET_KEY``
    and ``get_token`` are left alone (they hold no digit nor any of ``+/=!@#%^&*~``)."""
    return not value.startswith(("$", "%", "<", "{", "[")) and any(c.isdigit() or c in "+/=!@#%^&*~" for c in value)


#: (rule, what it looks like, pattern, which group is the secret, a check of the match):
#: rules 5 and 6 of §14.11, whose matches keep their context (a name, a host)
#: and lose only the secret, which becomes ``[REDACTED]``.
CONTEXT_RULES: tuple[tuple[str, str, re.Pattern[str], int | None, Callable[[re.Match[str]], bool] | None], ...] = (
    ("webhook-slack", "a Slack webhook URL",
     re.compile(r"(?<![A-Za-z0-9.-])hooks\.slack\.com/(?:services|workflows|triggers)/([A-Za-z0-9_/-]{8,256})"), 1, None),
    ("webhook-discord", "a Discord webhook URL",
     re.compile(r"(?<![A-Za-z0-9.-])(?:discord|discordapp)\.com/api/webhooks/[0-9]{1,32}/([A-Za-z0-9_-]{16,256})"),
     1, None),
    ("url-query-secret", "a token in a URL's query (?token=...)",
     re.compile(r"[?&](?:access_token|refresh_token|id_token|auth_token|token|api_key|apikey|api-key|key|secret|"
                r"client_secret|password|passwd|pwd|sig|signature|auth)=([^\s&#\"'<>]{1,512})", re.IGNORECASE), 1, None),
    ("credential-assignment", "a credential assignment (NAME=value, name: value)",
     re.compile(r"^[ \t]{0,64}(?:export[ \t]{1,64})?[\"']?([A-Za-z_][A-Za-z0-9_.-]{0,63})[\"']?[ \t]{0,64}[=:][ \t]{0,64}"
                r"(?:\"([^\"\n]{8,512})\"|'([^'\n]{8,512})'|([^\s\"'#]{8,512}))[ \t]{0,64},?$", re.MULTILINE),
     None, lambda m: _is_assignment_name(m[1]) and (m[4] is None or _literal_value(m[4]))),
    ("json-credential", "a credential in a JSON or YAML string (\"password\": \"...\", docker's \"auth\")",
     re.compile(r"\"([A-Za-z_][A-Za-z0-9_.-]{0,63})\"[ \t]{0,64}:[ \t]{0,64}\"([^\"\\\s]{8,512})\""), 2,
     lambda m: _is_assignment_name(m[1]) or m[1].lower() == "auth"),
    ("netrc", "a .netrc password",
     re.compile(r"(?:^[ \t]{0,64}password[ \t]{1,64}(?=[^\s=:]\S{0,511}[ \t]{0,64}$)|"
                r"(?<![^\s])login[ \t]{1,64}\S{1,256}[ \t]{1,64}password[ \t]{1,64})([^\s=:]\S{0,511})(?=[ \t]|$)",
                re.MULTILINE), 1, None),
    ("pgpass", "a .pgpass line's password",
     re.compile(r"^(?:\\.|[^\s:\\]){1,253}:(?:[0-9]{1,5}|\*):(?:\\.|[^\s:\\]){1,63}:[A-Za-z_*][^\s:\\]{0,62}:"
                r"((?:\\.|[^\s:\\]){1,512})[ \t]{0,64}$", re.MULTILINE), 1, None),
)


def _secret_group(m: re.Match[str], group: int | None) -> int:
    if group is not None:
        return group
    return next(g for g in range(2, (m.re.groups or 0) + 1) if m[g] is not None)


#: The line rules (no match spans a line end) and what a line must hold to be
#: tried: lower-case literals, or (``pgpass``) a pattern with a literal first
#: character. Tried only on such lines, the rules cost what the literals' search
#: costs (~0.03 s per MB of tool output); tried at every line, 0.3 s.
_LINE_NEEDLES: dict[str, tuple[str, ...]] = {
    "credential-assignment": ("key", "secret", "token", "pass", "pwd", "credential", "_pat"),
    "netrc": ("password",),
}
_LINE_NEEDLES_RX = {rule: re.compile("|".join(map(re.escape, n)), re.IGNORECASE) for rule, n in _LINE_NEEDLES.items()}
_PGPASS_HINT = re.compile(r":(?:[0-9]{1,5}|\*):")


def _needle_positions(rule: str, text: str) -> Iterator[int]:
    if rule == "pgpass":
        yield from (m.start() for m in _PGPASS_HINT.finditer(text))
        return
    if not text.isascii():  # lower() may change a non-ASCII text's length, and with it the offsets
        yield from (m.start() for m in _LINE_NEEDLES_RX[rule].finditer(text))
        return
    low = text.lower()
    for needle in _LINE_NEEDLES[rule]:
        at = low.find(needle)
        while at >= 0:
            yield at
            at = low.find(needle, at + 1)


def _matches(rule: str, rx: re.Pattern[str], text: str) -> Iterator[re.Match[str]]:
    """``rx.finditer(text)``, the same matches; a line rule is tried only on lines holding its needles."""
    if rule != "pgpass" and rule not in _LINE_NEEDLES:
        yield from rx.finditer(text)
        return
    lines = set()
    for at in _needle_positions(rule, text):
        lines.add(text.rfind("\n", 0, at) + 1)
    for start in sorted(lines):
        end = text.find("\n", start)
        yield from rx.finditer(text, start, len(text) if end < 0 else end)


def _context_spans(rule: str, rx: re.Pattern[str], group: int | None,
                   check: Callable[[re.Match[str]], bool] | None, text: str) -> list[tuple[int, int]]:
    """The spans of the secrets a context rule finds in ``text`` (a ``[REDACTED]`` one is none)."""
    if not _may_match(rule, text):
        return []
    spans = []
    for m in _matches(rule, rx, text):
        if check is not None and not check(m):
            continue
        g = _secret_group(m, group)
        if m[g] != REDACTED:
            spans.append(m.span(g))
    return spans


def _splice(text: str, spans: list[tuple[int, int]]) -> str:
    out, at = [], 0
    for a, b in spans:
        out += [text[at:a], REDACTED]
        at = b
    return "".join(out) + text[at:]


#: ``GIT_CONFIG_KEY_<n>`` names a Git config key (``GIT_CONFIG_COUNT``'s entries, Git 2.31): a key's name,
#: never a secret, and without it every git the shell runs fails ("missing config key").
_GIT_CONFIG_KEY = re.compile(r"GIT_CONFIG_KEY_[0-9]+")


def is_credential_name(name: str) -> bool:
    """Whether an environment variable's name looks like it holds a credential (not ``GIT_CONFIG_KEY_<n>``)."""
    return CREDENTIAL_NAME.search(name) is not None and _GIT_CONFIG_KEY.fullmatch(name) is None


def credential_env_values(environ: Mapping[str, str]) -> list[str]:
    """The values (at least :data:`MIN_ENV_SECRET` characters) of the credential-looking variables of ``environ``."""
    return [v for k, v in environ.items() if len(v) >= MIN_ENV_SECRET and is_credential_name(k)]


#: The shortest base64 piece of a secret looked for (two groups: 6 bytes of the secret).
MIN_ENCODED = 8


def encoded_forms(secret: str) -> set[str]:
    """The encodings of ``secret`` that rule 1 takes out too (§14.11): percent-encoded, base64.

    Percent: ``quote`` with and without ``/`` safe, ``quote_plus``, each with
    upper- and lower-case hex. Base64 (standard and URL-safe): the part of
    the encoding that depends on the secret's bytes alone, for each of its 3
    alignments in a longer encoded text (``user:SECRET`` in a Basic
    ``Authorization`` header, a docker ``auth``): the groups before and after
    it mix in other bytes and are left, as a CI log mask does.
    """
    from urllib.parse import quote_from_bytes

    try:
        # The environment's bytes (os.environ keeps undecodable ones as surrogates).
        raw = secret.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that no byte string gave: no encoding of it exists
        return set()
    forms = set()
    for enc in (quote_from_bytes(raw, safe=""), quote_from_bytes(raw), quote_from_bytes(raw, safe=" ").replace(" ", "+")):
        if enc != secret:
            forms |= {enc, re.sub(r"%[0-9A-F]{2}", lambda m: m[0].lower(), enc)}
    for pad in (0, 1, 2):
        whole = (pad + len(raw)) // 3 * 4  # the complete groups
        b = base64.b64encode(b"\0" * pad + raw)[4 if pad else 0 : whole].decode()
        if len(b) >= MIN_ENCODED:
            forms |= {b, b.replace("+", "-").replace("/", "_")}
    forms.discard(secret)
    return forms


def _secrets(secrets: Iterable[str]) -> list[str]:
    # Longest first, so a secret containing another is replaced whole; each
    # value's encoded forms after the values themselves of their length.
    values = {s for s in secrets if s and len(s) >= MIN_KEY_SECRET}
    forms = set().union(*(encoded_forms(v) for v in values)) - values if values else set()
    return sorted(values, key=len, reverse=True) + sorted(forms, key=len, reverse=True)


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
    for rule, _what, rx, group, check in CONTEXT_RULES:
        spans = _context_spans(rule, rx, group, check, text)
        if spans:
            text = _splice(text, spans)
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

    secrets = list(secrets)
    values = _secrets(secrets)
    plain = set(secrets)
    for secret in values:
        what = ("the value of a credential-looking environment variable" if secret in plain
                else "an encoded copy (base64 or percent) of a credential-looking variable's value")
        start = work.find(secret)
        while start >= 0:
            found("secret-value" if secret in plain else "encoded-secret-value", what, start, len(secret))
            start = work.find(secret, start + len(secret))
    if _may_match("private-key", work):
        for m in list(_PRIVATE_KEY.finditer(work)):
            if m[0] != f"-----BEGIN {m[1]}PRIVATE KEY-----{REDACTED}-----END {m[1]}PRIVATE KEY-----":
                found("private-key", "a private key block", m.start(), len(m[0]))
    if _may_match("url-userinfo", work):
        for m in list(_userinfo(work)):
            if m[2] != USERINFO_REDACTED:
                found("url-userinfo", "a URL with user-info (user:password@)", m.start(2), len(m[2]))
    for rule, what, rx, group, check in CONTEXT_RULES:
        for a, b in _context_spans(rule, rx, group, check, work):
            found(rule, what, a, b - a)
    for rule, what, rx in TOKEN_RULES:
        if _may_match(rule, work):
            for m in list(rx.finditer(work)):
                found(rule, what, m.start(), len(m[0]))
    return sorted(hits, key=lambda h: h.start)


def scan_value(value: object, secrets: Iterable[str] = (),
               find: Callable[[str, list[str]], list[Hit]] | None = None) -> list[tuple[str, Hit]]:
    """Every hit in a decoded object's value, with where in the value: ``(path, hit)``.

    A blob's value (bytes) is read as UTF-8, invalid bytes replaced, its
    path ``blob``; in a structured value each text string is scanned, keys
    included (path ``key`` or ``toolCalls[0].arguments``; a key itself is
    ``<key name>``). Links (32-byte strings) are ids, not text. ``find``:
    what looks in one text (default :func:`find_secrets`; the CLI's scan
    adds a library's detectors).
    """
    found: list[tuple[str, Hit]] = []
    values = list(secrets)
    find_secrets = _find_secrets if find is None else find
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


_find_secrets = find_secrets
