"""df-config: print the sample configuration, or check a configuration as the daemons would load it.

``df-config sample > /etc/dfpubsub/dfpubsub.toml`` writes every setting with
its default and help; ``df-config check --config FILE`` loads FILE, the
environment and any flags exactly as a daemon does, runs the checks every
daemon runs before it starts (the same code: :func:`dfpubsub.daemon.check_settings`),
and prints the problem on one line (exit 2) or the effective settings as JSON (exit 0).
"""

from __future__ import annotations

import json
import sys

from dfpubsub.config import add_config_arguments, settings_from_args
from dfpubsub.console import command_parser, console_main
from dfpubsub.daemon import check_settings
from dfpubsub.sample_config import render_sample

__all__ = ["main"]


@console_main("df-config")
def main(argv: list[str] | None = None) -> int:
    """Entry point of ``df-config``."""
    parser, sub = command_parser("df-config", __doc__)
    sub.add_parser("sample", help="print the sample configuration (every setting, its default and help)")
    add_config_arguments(sub.add_parser("check", help="load and validate the configuration; print it as JSON"))
    args = parser.parse_args(argv)
    if args.command == "sample":
        sys.stdout.write(render_sample())
        return 0
    print(json.dumps(check_settings(settings_from_args(args)).model_dump(mode="json"), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
