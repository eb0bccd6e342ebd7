"""df-keys: make and inspect the CURVE key pairs of publishers and subscribers.

``df-keys generate DIR NAME`` writes ``NAME.key`` (the public key, to hand
out: a publisher's goes to its subscribers' ``curve_server_key``, a
subscriber's into its publishers' ``curve_allowed_dir``) and
``NAME.key_secret`` (mode 0600, for ``curve_secret_key_file``), in ZeroMQ's
certificate format. ``df-keys show FILE`` prints the public key of a key file;
``df-keys list DIR`` the public keys a publisher's ``curve_allowed_dir`` lets in.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from dfpubsub.backends.extras import needs_extra
from dfpubsub.console import command_parser, console_main
from dfpubsub.errors import ConfigError

__all__ = ["main"]


@console_main("df-keys")
def main(argv: list[str] | None = None) -> int:
    """Entry point of ``df-keys``."""
    parser, sub = command_parser("df-keys", __doc__)
    gen = sub.add_parser("generate", help="write NAME.key and NAME.key_secret into DIR")
    gen.add_argument("dir")
    gen.add_argument("name")
    sub.add_parser("show", help="print the public key of a key file").add_argument("file")
    sub.add_parser("list", help="print the public keys of the key files in DIR").add_argument("dir")
    args = parser.parse_args(argv)
    with needs_extra("df-keys"):
        import zmq.auth
        from dfpubsub.drivers.zeromq.curve import read_public_keys
    if args.command == "generate":
        if not args.name or "/" in args.name:
            raise ConfigError(f"a key name is a file name, not {args.name!r}")
        target = Path(args.dir)
        if (target / f"{args.name}.key").exists() or (target / f"{args.name}.key_secret").exists():
            raise ConfigError(f"{target / args.name}.key or .key_secret exists; not overwriting a key")
        target.mkdir(parents=True, exist_ok=True)
        public, secret = zmq.auth.create_certificates(target, args.name)
        os.chmod(secret, 0o600)
        print(zmq.auth.load_certificate(public)[0].decode())
        return 0
    if args.command == "show":
        try:
            public_key, _ = zmq.auth.load_certificate(args.file)
        except (ValueError, OSError, UnicodeError) as exc:
            raise ConfigError(f"{args.file} is not a ZeroMQ key file: {exc}") from exc
        print(public_key.decode())
        return 0
    if not Path(args.dir).is_dir():
        raise ConfigError(f"{args.dir} is not a directory")
    for key in sorted(read_public_keys(args.dir)):
        print(key.decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
