"""Shared by tests/unit/test_tl1_codec.py and tests/integration/test_tl1_codec.py."""

from __future__ import annotations

PW = "Sw0rdf1sh-7"


def reply(ctag: str, *lines: str, status: str = "COMPLD", sid: str = "( nil )", eol: str = "\r\n") -> bytes:
    body = "".join(f'   "{line}"{eol}' for line in lines)
    return f"{eol}\n   {sid} 26-11-29 10:00:00{eol}M  {ctag} {status}{eol}{body};".encode()


def deny(ctag: str, code: str, comment: str = "") -> bytes:
    extra = f"   /* {comment} */\r\n" if comment else ""
    return f"\r\n\n   ( nil ) 26-11-29 10:00:00\r\nM  {ctag} DENY\r\n   {code}\r\n{extra};".encode()


def autonomous(atag: str, *lines: str, code: str = "A", verb: str = "REPT DBCHG") -> bytes:
    body = "".join(f'   "{line}"\r\n' for line in lines)
    return f"\r\n\n   ( nil ) 26-11-29 10:00:01\r\n{code}  {atag} {verb}\r\n{body};".encode()
