"""`labctl dom …`: decode transceiver DOM from an EEPROM image file or read it from a live module."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from labctl.core.errors import InputError

dom_app = typer.Typer(
    help="Transceiver digital optical monitoring: Rx/Tx power per lane, bias, temperature, Vcc.",
    no_args_is_help=True,
)


@dom_app.command("decode")
def dom_decode(
    file: Annotated[
        Path,
        typer.Argument(
            help="EEPROM image: SFP = A0h+A2h (512 bytes, `ethtool -m IF raw on`); QSFP/CMIS = lower page "
            "then upper pages at page*128+128 (optoe layout)."
        ),
    ],
    hex_text: Annotated[
        bool, typer.Option("--hex", help="FILE is hex text (bare bytes or an `ethtool -m IF hex on` dump).")
    ] = False,
) -> None:
    """Decode an EEPROM image and print its DOM fields as JSON (latched flags included: a file has no
    other reader to steal them from)."""
    from labctl.linux.transceiver import UnknownModuleError, decode_image, parse_hex

    try:
        data = file.read_text() if hex_text else file.read_bytes()
    except UnicodeDecodeError:
        raise InputError(f"{file}: not text; drop --hex to decode a binary image") from None
    except OSError as e:
        raise InputError(f"{file}: cannot read ({e.strerror})") from None
    raw = parse_hex(data, str(file)) if isinstance(data, str) else data
    try:
        reading = decode_image(raw, str(file))
    except UnknownModuleError as e:
        if not hex_text and raw and set(raw) <= _HEX_TEXT:
            raise UnknownModuleError(f"{e}; the file looks like hex text: add --hex") from None
        raise
    print(json.dumps(reading.to_dict(), indent=2))


_HEX_TEXT = frozenset(b"0123456789abcdefABCDEFx:, \t\r\n")


@dom_app.command("read")
def dom_read(
    iface: Annotated[str, typer.Argument(help="Network interface with a transceiver, e.g. ens1f0np0.")],
    netns: Annotated[
        str | None, typer.Option("--netns", help="Network namespace the interface lives in.")
    ] = None,
    latched: Annotated[
        bool,
        typer.Option(
            "--latched",
            help="Also read latched LOS/LOL flags. They clear on read, so the NIC driver or a monitoring "
            "daemon will miss them.",
        ),
    ] = False,
) -> None:
    """Read a live module once through ethtool netlink (legacy ioctl fallback) and print JSON."""
    from labctl.linux.ethtool import read_module

    print(json.dumps(read_module(iface, netns, latched=latched).to_dict(), indent=2))


def register(app: typer.Typer) -> None:
    app.add_typer(dom_app, name="dom")
