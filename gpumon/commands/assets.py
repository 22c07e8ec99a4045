"""``gpumon assets``: the deployment files that come with gpumon, from an installed package too.

A fleet installs gpumon from a wheel, without a checkout; what it needs to deploy comes inside the
package: the Grafana dashboards, the Prometheus alert and recording rules with their promtool tests
(prometheus/tests: ``promtool test rules`` where they are written), the systemd unit, the deploy/
examples (config, web config, Alertmanager, Prometheus scrape and federation, Kubernetes) and the
LICENSE.

``gpumon assets list`` names them, ``gpumon assets show NAME`` prints one, ``gpumon assets write DIR``
writes them all under DIR (their layout kept; an existing file that differs is left alone and
named, unless ``--force``). In a wheel they live in ``gpumon/deploy_assets/`` (copied there by
setup.py's build from the checkout's directories); in a checkout they are read where they are.
This module imports only the standard library: setup.py loads it to know what to copy.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ASSET_PATTERNS = (
    "LICENSE",
    "dashboards/*.json",
    "prometheus/*.rules.yml",
    "prometheus/tests/*.yml",
    "systemd/*.service",
    "deploy/**/*.yml",
    "deploy/**/*.yaml",
)
"""What is shipped, as globs relative to the checkout's root (the layout in the package is the same)."""
PACKAGED_DIR = "deploy_assets"
"""The directory inside the installed ``gpumon`` package that holds them."""

EXIT_OK = 0
EXIT_USAGE = 2


def asset_files(root: Path) -> dict[str, Path]:
    """Relative name (``prometheus/gpumon-alerts.rules.yml``) -> file, of every asset under ``root``."""
    found: dict[str, Path] = {}
    for pattern in ASSET_PATTERNS:
        for path in sorted(root.glob(pattern)):
            if path.is_file():
                found[path.relative_to(root).as_posix()] = path
    return dict(sorted(found.items()))


def assets_root() -> Path | None:
    """Where the assets are: inside the installed package, else the checkout gpumon runs from."""
    package = Path(__file__).resolve().parent.parent
    for root in (package / PACKAGED_DIR, package.parent):
        if asset_files(root):
            return root
    return None


def configure(parser: argparse.ArgumentParser) -> None:
    """Give ``gpumon assets``'s parser (made by gpumon.cli) its description, options and commands."""
    parser.description = (
        "The deployment files that come with gpumon: Grafana dashboards, Prometheus rules and their promtool "
        "tests, the systemd unit, the deploy/ examples and the LICENSE. list names them, show NAME prints one, "
        "write DIR writes them all."
    )
    sub = parser.add_subparsers(dest="assets_command", metavar="SUBCOMMAND")
    listing = sub.add_parser("list", help="name every file (the default)", description="Name every file.")
    listing.set_defaults(func=cmd_list)
    show = sub.add_parser("show", help="print one file", description="Print one file to stdout.")
    show.add_argument("name", help="a name as gpumon assets list gives it, e.g. prometheus/gpumon-alerts.rules.yml")
    show.set_defaults(func=cmd_show)
    write = sub.add_parser(
        "write",
        help="write every file under DIR",
        description="Write every file under DIR, keeping their layout (DIR/prometheus/..., DIR/systemd/...). "
        "A file already there that differs is left alone and named (exit 2) unless --force.",
    )
    write.add_argument("dir", type=Path, help="directory to write into (created if needed)")
    write.add_argument("--force", action="store_true", help="replace files that differ")
    write.set_defaults(func=cmd_write)
    parser.set_defaults(func=cmd_list)


def _assets() -> dict[str, Path] | None:
    root = assets_root()
    if root is None:
        print("gpumon: no deployment files found in this installation (a build without them)", file=sys.stderr)
        return None
    return asset_files(root)


def cmd_list(args: argparse.Namespace) -> int:
    assets = _assets()
    if assets is None:
        return EXIT_USAGE
    for name in assets:
        print(name)
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    assets = _assets()
    if assets is None:
        return EXIT_USAGE
    path = assets.get(args.name)
    if path is None:
        print(f"gpumon: no asset {args.name!r}; gpumon assets list names them", file=sys.stderr)
        return EXIT_USAGE
    sys.stdout.write(path.read_text())
    return EXIT_OK


def cmd_write(args: argparse.Namespace) -> int:
    assets = _assets()
    if assets is None:
        return EXIT_USAGE
    target: Path = args.dir
    differing = [
        name
        for name, path in assets.items()
        if (target / name).exists() and (target / name).read_bytes() != path.read_bytes()
    ]
    if differing and not args.force:
        print(f"gpumon: {len(differing)} file(s) in {target} differ; nothing written (--force replaces them):",
              file=sys.stderr)  # fmt: skip
        for name in differing:
            print(f"  - {target / name}", file=sys.stderr)
        return EXIT_USAGE
    try:
        for name, path in assets.items():
            out = target / name
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(path.read_bytes())
    except OSError as exc:
        print(f"gpumon: cannot write into {target}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote {len(assets)} file(s) under {target}")
    return EXIT_OK
