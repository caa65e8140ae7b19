"""Secret scanning measured: kxen-agent's rules against the detect-secrets library, on a labelled corpus.

::

    .venv/bin/python -m bench.secret_scan [--clean 10000] [--per-kind 40] [--seed 25] [--json FILE]

The corpus (deterministic for a seed):

- **planted**: for each kind of secret, ``--per-kind`` tool outputs that
  hold one (a fresh random value each), in the text a tool prints it in:
  ``cat ~/.aws/credentials``, ``env`` (``DB_PASS``, ``MYSQL_PWD``),
  ``.netrc``, ``.pgpass``, a docker ``config.json``, Slack, Discord and
  ``?token=`` webhook URLs, base64 (a Basic ``Authorization`` header) and
  percent-encoded (a URL) copies of a value the runner knows (a
  credential-looking variable of its environment), then the formats both
  know (GitHub, OpenAI, AWS key id, Slack token, private key, URL user-info)
  and formats only the library knows (Stripe, JWT, npm, PyPI, GitLab,
  SendGrid, Twilio, Telegram, Mailchimp, Azure storage, Square, Artifactory,
  Discord bot);
- **clean**: ``--clean`` tool outputs holding no secret, of the kinds a
  session holds, full of kxen ids (``ses_…``, ``msg_…``, ``run_…``, 64-hex
  BLAKE3 object ids) and Git SHAs: ``git log``, ``session list --json``,
  ``fsck``, ``git status``/``diff``, ``ls -l``, pytest runs, ``docker
  images``, a ``package-lock.json`` (``sha512-`` base64 integrity), ``env``
  without credentials, and Python code that *names* credentials
  (``token = self.token``, ``api_key = os.environ[...]``).

A planted secret is **found** when a hit overlaps it (the library reports
lines: a hit on its line). A clean output with any hit is a **false
positive**. Scanners: ``kxen rules`` (:func:`kxen_agent.runtime.redaction.find_secrets`,
rule 1 given the runner's known values), ``detect-secrets`` with its
defaults (every detector, its default filters, each output scanned as a
text file), each library detector alone, and ``shipped`` (what ``bundle
verify``, ``session export --scan`` and ``session push`` run:
:func:`kxen_agent.cli.secret_scan.scan_text`, the rules plus
:data:`~kxen_agent.cli.secret_scan.LIBRARY_DETECTORS`). RELIABILITY.md
("Secret scanning") has the figures.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import string
import time
import urllib.parse
from typing import Callable

Planted = tuple[str, str, str, list[str]]  # (kind, text, the secret, the runner's known values)

_AZ09 = string.ascii_letters + string.digits


def _r(rng: random.Random, n: int, alphabet: str = _AZ09) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def _hex(rng: random.Random, n: int) -> str:
    return _r(rng, n, "0123456789abcdef")


def _noise(rng: random.Random) -> str:
    return rng.choice(["", "$ ls\nREADME.md src tests\n", f"commit {_hex(rng, 40)}\n",
                       f"session ses_{_hex(rng, 20)} msg_{_hex(rng, 20)}\n"])


# ------------------------------------------------------------------ planted secrets

def _planted(rng: random.Random, per_kind: int) -> list[Planted]:
    out: list[Planted] = []

    def add(kind: str, make: Callable[[], tuple[str, str] | tuple[str, str, list[str]]]) -> None:
        for _ in range(per_kind):
            got = make()
            text, secret = got[0], got[1]
            known = got[2] if len(got) > 2 else []
            out.append((kind, _noise(rng) + text + _noise(rng), secret, list(known)))

    def aws_file() -> tuple[str, str]:
        sk = _r(rng, 40, _AZ09 + "/+")
        return (f"$ cat ~/.aws/credentials\n[default]\naws_access_key_id = AKIA{_r(rng, 16, string.ascii_uppercase + '234567')}\n"
                f"aws_secret_access_key = {sk}\nregion = eu-west-1\n", sk)

    def env_pass() -> tuple[str, str]:
        pw = _r(rng, 6) + "9" + _r(rng, 8)
        return f"$ env | sort\nDB_HOST=db.internal\nDB_PASS={pw}\nHOME=/root\nPATH=/usr/bin:/bin\nPWD=/w\n", pw

    def env_pwd() -> tuple[str, str]:
        pw = _r(rng, 12) + "!"
        return f"$ env\nLANG=C.UTF-8\nMYSQL_PWD={pw}\nOLDPWD=/\nSHLVL=1\n", pw

    def netrc() -> tuple[str, str]:
        pw = _r(rng, 14)
        return f"$ cat ~/.netrc\nmachine api.example.com login deploy password {pw}\n", pw

    def pgpass() -> tuple[str, str]:
        pw = _r(rng, 16)
        return f"$ cat ~/.pgpass\ndb.example.com:5432:app:alice:{pw}\n", pw

    def docker() -> tuple[str, str]:
        auth = base64.b64encode(f"robot:{_r(rng, 20)}".encode()).decode()
        return ('$ cat ~/.docker/config.json\n{\n\t"auths": {\n\t\t"registry.example.com": {\n'
                f'\t\t\t"auth": "{auth}"\n\t\t}}\n\t}}\n}}\n', auth)

    def slack_hook() -> tuple[str, str]:
        path = f"T{_r(rng, 8, string.ascii_uppercase + string.digits)}/B{_r(rng, 8, string.ascii_uppercase + string.digits)}/{_r(rng, 24)}"
        return f"posting build status to https://hooks.slack.com/services/{path}\n", path

    def discord_hook() -> tuple[str, str]:
        tok = _r(rng, 68, _AZ09 + "_-")
        return f"notify: https://discord.com/api/webhooks/{rng.randrange(10**17, 10**18)}/{tok}\n", tok

    def query_token() -> tuple[str, str]:
        tok = _r(rng, 32)
        return f"curl -X POST 'https://ci.example.com/generic-webhook-trigger/invoke?token={tok}'\n", tok

    def b64_known() -> tuple[str, str, list[str]]:
        pw = _r(rng, 18)
        enc = base64.b64encode(f"admin:{pw}".encode()).decode()
        return f"> GET /api HTTP/1.1\n> Authorization: Basic {enc}\n", enc[8:-4], [pw]

    def pct_known() -> tuple[str, str, list[str]]:
        pw = _r(rng, 8) + "/@:" + _r(rng, 8)
        enc = urllib.parse.quote(pw, safe="")
        return f"fetching https://example.com/login?user=alice&pass={enc}&next=%2F\n", enc, [pw]

    for kind, make in (("aws-credentials-file", aws_file), ("env DB_PASS", env_pass), ("env MYSQL_PWD", env_pwd),
                       (".netrc", netrc), (".pgpass", pgpass), ("docker auth", docker),
                       ("Slack webhook", slack_hook), ("Discord webhook", discord_hook),
                       ("?token= webhook", query_token), ("base64 of a known value", b64_known),
                       ("percent-encoded known value", pct_known)):
        add(kind, make)

    def token(kind: str, value: Callable[[], str], template: str) -> None:
        def make() -> tuple[str, str]:
            v = value()
            return template.format(v), v
        add(kind, make)

    # Formats both know.
    token("GitHub token", lambda: "ghp_" + _r(rng, 36), "remote: {}\n")
    token("OpenAI key", lambda: "sk-proj-" + _r(rng, 40, _AZ09 + "_-"), "OPENAI key {}\n")
    token("AWS key id", lambda: "AKIA" + _r(rng, 16, string.ascii_uppercase + "234567"), "AccessKeyId: {}\n")
    token("Slack token", lambda: f"xoxb-{rng.randrange(10**11, 10**12)}-{_r(rng, 24)}", "SLACK {}\n")
    token("private key", lambda: f"-----BEGIN RSA PRIVATE KEY-----\n{_r(rng, 64, _AZ09 + '+/')}\n"
          "-----END RSA PRIVATE KEY-----", "$ cat id_rsa\n{}\n")
    token("URL user-info", lambda: _r(rng, 20), "origin\thttps://bob:{}@git.example.com/r.git (fetch)\n")

    # Formats only the library knows.
    def jwt() -> str:
        def b64(d: dict) -> str:
            return base64.urlsafe_b64encode(json.dumps(d).encode()).decode().rstrip("=")
        return f"{b64({'alg': 'HS256', 'typ': 'JWT'})}.{b64({'sub': _r(rng, 10), 'iat': rng.randrange(10**9)})}.{_r(rng, 43, _AZ09 + '_-')}"

    token("Stripe key", lambda: "sk_live_" + _r(rng, 24), "stripe {}\n")
    token("JWT", jwt, "Authorization: Bearer {}\n")
    token("npm token", lambda: "npm_" + _r(rng, 36), "//registry.npmjs.org/:_authToken={}\n")
    token("PyPI token", lambda: "pypi-AgEIcHlwaS5vcmc" + _r(rng, 70, _AZ09 + "_-"), "password = {}\n")
    token("GitLab token", lambda: "glpat-" + _r(rng, 20, _AZ09 + "_-"), "token {}\n")
    token("SendGrid key", lambda: f"SG.{_r(rng, 22, _AZ09 + '_-')}.{_r(rng, 43, _AZ09 + '_-')}", "SENDGRID {}\n")
    token("Twilio key", lambda: "SK" + _hex(rng, 32), "twilio {}\n")
    token("Telegram bot token", lambda: f"{rng.randrange(10**8, 10**9)}:AA{_r(rng, 33, _AZ09 + '_-')}", "bot {}\n")
    token("Mailchimp key", lambda: _hex(rng, 32) + "-us" + str(rng.randrange(1, 20)), "mc {}\n")
    token("Azure storage key", lambda: _r(rng, 86, _AZ09 + "+/") + "==",
          "DefaultEndpointsProtocol=https;AccountName=x;AccountKey={}\n")
    return out


# ------------------------------------------------------------------ clean tool outputs

def _kid(rng: random.Random, prefix: str) -> str:
    return f"{prefix}_{_hex(rng, 20)}"


def _clean(rng: random.Random, n: int) -> list[str]:
    names = ["alice", "bob", "carol", "kxen test"]

    def git_log() -> str:
        return "".join(f"commit {_hex(rng, 40)}\nAuthor: {rng.choice(names)} <x@example.com>\n"
                       f"Date:   Thu Dec 3 22:{rng.randrange(60):02d}:00 2026\n\n    fix {rng.choice(['parser', 'gc', 'lease'])}"
                       f" ({_hex(rng, 7)})\n\n" for _ in range(rng.randrange(1, 6)))

    def session_list() -> str:
        return json.dumps({"sessions": [{"id": _kid(rng, "ses"), "head": _hex(rng, 64), "lastMessage": _kid(rng, "msg"),
                                         "run": _kid(rng, "run"), "workspace": {"commit": _hex(rng, 40), "dirty": False},
                                         "agent": {"lock": _hex(rng, 64), "model": "gpt-4o-mini"},
                                         "tokens": rng.randrange(10**5), "max_tokens": 4096}
                                        for _ in range(rng.randrange(1, 4))]}, indent=2)

    def fsck() -> str:
        return "".join(f"object {_hex(rng, 64)} ({rng.choice(['message', 'blob', 'session'])}) ok\n"
                       for _ in range(rng.randrange(2, 8))) + f"refs/sessions/{_kid(rng, 'ses')}/head {_hex(rng, 64)}\n"

    def git_diff() -> str:
        return (f"diff --git a/src/x.py b/src/x.py\nindex {_hex(rng, 7)}..{_hex(rng, 7)} 100644\n--- a/src/x.py\n+++ b/src/x.py\n"
                f"@@ -1,3 +1,3 @@\n-    key = cache_key(msg_id)\n+    key = cache_key(msg_id, '{_kid(rng, 'msg')}')\n")

    def ls() -> str:
        return "".join(f"-rw-r--r-- 1 root root {rng.randrange(10**6):>7} Dec  3 22:13 {_hex(rng, 62)}\n"
                       for _ in range(rng.randrange(2, 8)))

    def pytest_out() -> str:
        return (f"============ test session starts ============\ncollected {rng.randrange(200)} items\n\n"
                f"tests/test_tokens.py ....F..\n\nFAILED tests/test_tokens.py::test_token_refresh - "
                f"AssertionError: assert '{_hex(rng, 40)}' == '{_hex(rng, 40)}'\n1 failed, 6 passed in 0.{rng.randrange(99)}s\n")

    def docker_images() -> str:
        return "REPOSITORY   TAG   IMAGE ID   CREATED\n" + "".join(
            f"app{i}   latest   sha256:{_hex(rng, 64)}   2 days ago\n" for i in range(rng.randrange(1, 4)))

    def lockfile() -> str:
        return "".join(f'    "node_modules/pkg{i}": {{\n      "version": "1.{i}.0",\n      "resolved": '
                       f'"https://registry.npmjs.org/pkg{i}/-/pkg{i}-1.{i}.0.tgz",\n      "integrity": '
                       f'"sha512-{base64.b64encode(rng.randbytes(64)).decode()}"\n    }},\n' for i in range(rng.randrange(1, 4)))

    def env_clean() -> str:
        return (f"HOME=/root\nPATH=/usr/local/bin:/usr/bin\nPWD=/work/{_kid(rng, 'ses')}\nOLDPWD=/\n"
                f"TOKENIZERS_PARALLELISM=false\nKXEN_AGENT_STATE_DIR=/root/.local/share/kxen-agent\n"
                f"GIT_COMMIT={_hex(rng, 40)}\nSSH_AUTH_SOCK=/tmp/ssh-{_r(rng, 10)}/agent.{rng.randrange(10**5)}\n")

    def code() -> str:
        return ("class Client:\n    def __init__(self, token=None):\n        self.token = token\n"
                "        api_key = os.environ['OPENAI_API_KEY']\n        password = getpass.getpass()\n"
                f"        SECRET_KEY = settings.SECRET_KEY\n        self.session_id = '{_kid(rng, 'ses')}'\n"
                f"        self.head = '{_hex(rng, 64)}'\n        tokenizer = 'cl100k_base'\n")

    def uuids() -> str:
        return "".join(f"{_hex(rng, 8)}-{_hex(rng, 4)}-4{_hex(rng, 3)}-a{_hex(rng, 3)}-{_hex(rng, 12)}  "
                       f"{_kid(rng, 'run')}\n" for _ in range(rng.randrange(1, 5)))

    makers = [git_log, session_list, fsck, git_diff, ls, pytest_out, docker_images, lockfile, env_clean, code, uuids]
    return [makers[i % len(makers)]() for i in range(n)]


# ------------------------------------------------------------------ scanners

Finder = Callable[[str, list[str]], list[tuple[int, int]]]  # spans of what it reports


def _kxen(text: str, known: list[str]) -> list[tuple[int, int]]:
    from kxen_agent.runtime.redaction import find_secrets

    return [(h.start, h.start + h.length) for h in find_secrets(text, known)]


def _shipped(text: str, known: list[str]) -> list[tuple[int, int]]:
    from kxen_agent.cli.secret_scan import scan_text

    return [(h.start, h.start + h.length) for h in scan_text(text, known)]


def _library(plugins: list[str] | None) -> Finder:
    """detect-secrets as its users run it (``detect-secrets scan``): line by line, default filters; spans are lines."""
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    from detect_secrets.core.scan import _process_line_based_plugins
    from detect_secrets.settings import transient_settings

    names = plugins or [c.__name__ for c in get_mapping_from_secret_type_to_class().values()]

    def find(text: str, known: list[str]) -> list[tuple[int, int]]:
        lines = text.split("\n")
        starts = [0]
        for line in lines[:-1]:
            starts.append(starts[-1] + len(line) + 1)
        with transient_settings({"plugins_used": [{"name": n} for n in names]}):
            found = list(_process_line_based_plugins(list(enumerate(lines, 1)), "tool-output.txt"))
        return [(starts[s.line_number - 1], starts[s.line_number - 1] + len(lines[s.line_number - 1])) for s in found]

    return find


def measure(finder: Finder, planted: list[Planted], clean: list[str]) -> dict:
    per_kind: dict[str, list[int]] = {}
    t0 = time.perf_counter()
    for kind, text, secret, known in planted:
        a = text.index(secret)
        b = a + len(secret)
        hit = any(x < b and a < y for x, y in finder(text, known))
        per_kind.setdefault(kind, [0, 0])
        per_kind[kind][0] += hit
        per_kind[kind][1] += 1
    fp = sum(1 for text in clean if finder(text, []))
    found = sum(v[0] for v in per_kind.values())
    return {"found": found, "planted": len(planted), "recall": found / len(planted), "falsePositives": fp,
            "clean": len(clean), "perKind": {k: v[0] / v[1] for k, v in per_kind.items()},
            "seconds": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.secret_scan", description=__doc__.split("\n")[0])
    ap.add_argument("--clean", type=int, default=10_000, help="clean tool outputs (default 10,000)")
    ap.add_argument("--per-kind", type=int, default=40, help="planted outputs per kind of secret (default 40)")
    ap.add_argument("--seed", type=int, default=25)
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    ap.add_argument("--each", action="store_true", help="also measure every library detector alone")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    planted = _planted(rng, args.per_kind)
    clean = _clean(rng, args.clean)
    scanners: dict[str, Finder] = {"kxen rules": _kxen, "detect-secrets (defaults)": _library(None),
                                   "shipped (rules + LIBRARY_DETECTORS)": _shipped}
    if args.each:
        from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class

        for cls in get_mapping_from_secret_type_to_class().values():
            scanners[f"detect-secrets {cls.__name__}"] = _library([cls.__name__])
    results = {name: measure(f, planted, clean) for name, f in scanners.items()}
    kinds = list(dict.fromkeys(k for k, *_ in planted))
    cols = ["kxen rules", "detect-secrets (defaults)", "shipped (rules + LIBRARY_DETECTORS)"]
    print(f"corpus: {len(planted)} planted secrets ({len(kinds)} kinds x {args.per_kind}), {len(clean)} clean tool "
          f"outputs ({sum(map(len, clean)) / 1e6:.1f} MB), seed {args.seed}\n")
    print("| kind | kxen rules | detect-secrets | shipped |\n|---|---|---|---|")
    for k in kinds:
        print(f"| {k} | " + " | ".join(f"{results[c]['perKind'][k]:.0%}" for c in cols) + " |")
    print("| **recall** | " + " | ".join(f"**{results[c]['recall']:.1%}** ({results[c]['found']}/{results[c]['planted']})"
                                          for c in cols) + " |")
    print("| **false positives** (clean outputs with a hit) | " + " | ".join(
        f"**{results[c]['falsePositives']}** / {results[c]['clean']}" for c in cols) + " |")
    print("| time (s) | " + " | ".join(f"{results[c]['seconds']:.1f}" for c in cols) + " |")
    if args.each:
        print("\n| library detector alone | recall | false positives | kinds found |\n|---|---|---|---|")
        for name, r in results.items():
            if name.startswith("detect-secrets ") and name not in cols:
                got = ", ".join(k for k, v in r["perKind"].items() if v)
                print(f"| {name[len('detect-secrets '):]} | {r['recall']:.1%} | {r['falsePositives']} | {got or '-'} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seed": args.seed, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
