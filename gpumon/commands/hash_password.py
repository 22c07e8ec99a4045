"""``gpumon hash-password``: a bcrypt hash for ``basic_auth_users`` in web-config.yml.

The password is read from the terminal (asked twice, never echoed) or, with ``--stdin``, as
the first line of standard input (for scripts: ``printf '%s\\n' "$PW" | gpumon hash-password --stdin``).
Only the hash is printed. Exit 0 ok, 2 when no usable password was given.
"""

from __future__ import annotations

import argparse
import sys

EXIT_OK = 0
EXIT_USAGE = 2
BCRYPT_COST = 10
"""2^10 rounds, as ``htpasswd -nBC 10`` and the exporter-toolkit examples (~50 ms a check; verdicts are cached)."""
BCRYPT_MAX_BYTES = 72
"""bcrypt ignores (or, in bcrypt>=5, refuses) anything after 72 bytes."""


def configure(parser: argparse.ArgumentParser) -> None:
    """Give ``gpumon hash-password``'s parser (made by gpumon.cli) its description, options and command."""
    parser.description = (
        "Ask for a password twice (never echoed) and print its bcrypt hash, "
        "for basic_auth_users in the web config (--web-config-file)."
    )
    parser.add_argument(
        "--stdin", action="store_true", help="read the password from the first line of stdin instead of a prompt"
    )
    parser.set_defaults(func=run)


def hash_password(password: str, cost: int = BCRYPT_COST) -> str:
    """The ``$2b$...`` bcrypt hash of ``password``."""
    import bcrypt  # here: every command builds this parser, and the daemon needs no bcrypt

    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost)).decode()


def _read_password(from_stdin: bool) -> str:
    """The password, or ValueError with a message for the user."""
    if from_stdin:
        line = sys.stdin.readline()
        if not line:
            raise EOFError
        return line[:-1] if line.endswith("\n") else line
    import getpass

    if not sys.stdin.isatty():
        raise ValueError("stdin is not a terminal: pass the password on stdin with --stdin")
    first = getpass.getpass("Password: ")
    second = getpass.getpass("Password again: ")
    if first != second:
        raise ValueError("the passwords do not match")
    return first


def run(args: argparse.Namespace) -> int:
    try:
        password = _read_password(args.stdin).rstrip("\r")
    except (EOFError, KeyboardInterrupt):
        print("gpumon hash-password: no password given", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as exc:
        print(f"gpumon hash-password: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not password:
        print("gpumon hash-password: the password is empty", file=sys.stderr)
        return EXIT_USAGE
    if len(password.encode()) > BCRYPT_MAX_BYTES:
        print(f"gpumon hash-password: bcrypt uses at most {BCRYPT_MAX_BYTES} bytes of a password", file=sys.stderr)
        return EXIT_USAGE
    print(hash_password(password))
    return EXIT_OK
