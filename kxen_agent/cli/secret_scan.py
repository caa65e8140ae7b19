"""The look for credentials in what leaves this machine: ``bundle verify``, ``session export --scan``, ``session push``.

Owns turning objects into warning lines (one per hit, naming the object,
where in it and what it looks like — never the text) with two finders
over each text:

- the rules of :mod:`kxen_agent.runtime.redaction` (``objects_spec.md``
  §14.11), rule 1 taking the credential-looking variables of this process
  and their encoded forms;
- the token-format detectors of the ``detect-secrets`` library named in
  :data:`LIBRARY_DETECTORS` (Stripe, JWT, npm, PyPI, GitLab, ...): formats
  the redaction rules do not know. ``bench/secret_scan.py`` measured
  every detector of the library against these rules on a labelled corpus
  (docs/security.md, "Secret scanning"; RELIABILITY.md): those listed add recall and
  raised no false positive on 10,000 tool outputs full of kxen ids and Git
  SHAs; the library's entropy and keyword detectors, and the formats the
  rules already know, are left out (they flagged ids and SHAs, or found
  nothing more).

A library detector runs, through the library's public one-line scan
(``detect_secrets.core.scan.scan_line``: its default secret and context
filters; not its allowlist comment, so a tool output cannot hide a token
by saying ``pragma: allowlist secret``), only on the lines where one of
its patterns matches: most
texts hold none, and cost one regular-expression search per pattern. The
library is imported when the first text is scanned (a command that scans
nothing does not pay for it); without it installed the scan says so once
and uses the rules alone. This module must never print a secret, and
never decide an exit status: the commands do.
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable

from kxen_agent.runtime.redaction import Hit, credential_env_values, find_secrets, scan_value
from kxen_agent.store.objects import CorruptObject, RawObject, decode_stored

from ._render import err, term_text as t

__all__ = ["LIBRARY_ANCHORS", "LIBRARY_DETECTORS", "SecretScan", "library_finder", "scan_text"]

#: The detect-secrets detectors the scan adds (bench/secret_scan.py: each
#: finds a format §14.11 does not, with no false positive on the corpus).
LIBRARY_DETECTORS = (
    "ArtifactoryDetector",
    "AzureStorageKeyDetector",
    "DiscordBotTokenDetector",
    "GitLabTokenDetector",
    "JwtTokenDetector",
    "MailchimpDetector",
    "NpmDetector",
    "PypiTokenDetector",
    "SendGridDetector",
    "SquareOAuthDetector",
    "StripeDetector",
    "TelegramBotTokenDetector",
    "TwilioKeyDetector",
)

#: Literals that every match of a detector's patterns holds (each is a mandatory
#: literal of its pattern: a test checks): a text without any of a detector's
#: is skipped at C speed. Without them, Mailchimp's ``[0-9a-z]{32}-us`` alone
#: took 1.1 s per MB of lower-case text.
LIBRARY_ANCHORS: dict[str, tuple[str, ...]] = {
    "ArtifactoryDetector": ("AKC", "AP"),
    "AzureStorageKeyDetector": ("AccountKey=",),
    "DiscordBotTokenDetector": (".",),
    "GitLabTokenDetector": ("gl", "GR1348941"),
    "JwtTokenDetector": ("eyJ",),
    "MailchimpDetector": ("-us",),
    "NpmDetector": (":_authToken=",),
    "PypiTokenDetector": ("pypi-",),
    "SendGridDetector": ("SG.",),
    "SquareOAuthDetector": ("sq0csp-",),
    "StripeDetector": ("k_live_",),
    "TelegramBotTokenDetector": (":",),
    "TwilioKeyDetector": ("AC", "SK"),
}

class _Library:
    """Some detect-secrets detectors, run on the lines their patterns match."""

    def __init__(self, names: tuple[str, ...]) -> None:
        from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class

        by_name = {cls.__name__: (kind, cls) for kind, cls in get_mapping_from_secret_type_to_class().items()}
        missing = [n for n in names if n not in by_name]
        if missing:
            raise ImportError(f"detect-secrets has no {', '.join(missing)}")
        self.names = names
        self.kinds = {by_name[n][0]: n for n in names}
        self.patterns: list[tuple[tuple[str, ...], re.Pattern[str]]] = [
            (LIBRARY_ANCHORS.get(n, ("",)), rx) for n in names for rx in by_name[n][1]().denylist]

    def __call__(self, text: str) -> list[Hit]:
        patterns = [rx for anchors, rx in self.patterns if any(a in text for a in anchors)]
        if not any(rx.search(text) for rx in patterns):
            return []
        from detect_secrets.core.scan import scan_line
        from detect_secrets.settings import transient_settings

        lines = text.split("\n")
        starts = [0]
        for line in lines[:-1]:
            starts.append(starts[-1] + len(line) + 1)
        hits = []
        with transient_settings({"plugins_used": [{"name": n} for n in self.names]}):
            for number, line in enumerate(lines):
                if not any(rx.search(line) for rx in patterns):
                    continue
                for s in scan_line(line.rstrip()):
                    at = line.find(s.secret_value or "")
                    if at < 0:
                        at = 0
                    hits.append(Hit(f"library:{self.kinds.get(s.type, s.type)}", f"a {s.type} (detect-secrets)",
                                    starts[number] + at, len(s.secret_value or line)))
        return hits


_library: Any = None


def library_finder(names: tuple[str, ...] = LIBRARY_DETECTORS) -> Callable[[str], list[Hit]] | None:
    """The library's detectors as a finder over one text; None when detect-secrets is not installed."""
    global _library
    if names != LIBRARY_DETECTORS:
        return _Library(names)
    if _library is None:
        try:
            _library = _Library(names)
        except ImportError:
            _library = False
    return _library or None


def scan_text(text: str, secrets: list[str]) -> list[Hit]:
    """What the §14.11 rules and the library's detectors find in ``text``, by position (one hit per place)."""
    hits = find_secrets(text, secrets)
    lib = library_finder()
    if lib is not None:
        taken = [(h.start, h.start + h.length) for h in hits]
        hits += [h for h in lib(text) if not any(a < h.start + h.length and h.start < b for a, b in taken)]
        hits.sort(key=lambda h: h.start)
    return hits


class SecretScan:
    """Called with each object; collects (object, where in it, hit) and prints them as warnings."""

    def __init__(self) -> None:
        self.secrets = credential_env_values(os.environ)
        self.hits: list[tuple[RawObject, str, Hit]] = []
        self._warned_library = False

    def __call__(self, obj: RawObject) -> None:
        try:
            value = decode_stored(obj)
        except CorruptObject:  # the verification names it; nothing to scan
            return
        if library_finder() is None and not self._warned_library:
            self._warned_library = True
            err("kxen-agent: note: detect-secrets is not installed: the scan uses the redaction rules alone "
                "(pip install detect-secrets)")
        self.hits += [(obj, where, hit) for where, hit in scan_value(value, self.secrets, find=scan_text)]

    def warn(self, what: str) -> None:
        """One warning line per hit on stderr: ``what`` names the bundle or the sessions."""
        for obj, where, hit in self.hits:
            err(f"kxen-agent: warning: {what}: object {obj.hex} ({obj.kind}), {t(where, quote=False)}: "
                f"looks like {hit.describe()}; the text is not shown")
