"""Reading a rendered report back: elements by tag/class/id, and the embedded images."""

from __future__ import annotations

import base64
import io
from html.parser import HTMLParser

import matplotlib.image


class Element:
    def __init__(self, tag: str, attrs: dict):
        self.tag, self.attrs, self.text = tag, attrs, ""

    @property
    def classes(self) -> set[str]:
        return set((self.attrs.get("class") or "").split())


class Collect(HTMLParser):
    """Every element with its attributes and the text inside it (nested text included)."""

    VOID = {"img", "meta", "br", "link", "input", "hr"}

    def __init__(self):
        super().__init__()
        self.elements: list[Element] = []
        self._open: list[Element] = []

    def handle_starttag(self, tag, attrs):
        el = Element(tag, dict(attrs))
        self.elements.append(el)
        if tag not in self.VOID:
            self._open.append(el)

    def handle_endtag(self, tag):
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i].tag == tag:
                del self._open[i:]
                break

    def handle_data(self, data):
        for el in self._open:
            el.text += data


def parse(html: str) -> list[Element]:
    c = Collect()
    c.feed(html)
    return c.elements


def find(elements: list[Element], tag: str | None = None, cls: str | None = None, **attrs) -> list[Element]:
    return [e for e in elements if (tag is None or e.tag == tag) and (cls is None or cls in e.classes)
            and all(e.attrs.get(k.replace("_", "-")) == v for k, v in attrs.items())]


def decode_png(src: str):
    """The pixels of a data:image/png;base64 URI (raises if it is not a readable PNG)."""
    head, _, data = src.partition(",")
    assert head == "data:image/png;base64", head[:40]
    raw = base64.b64decode(data)
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    return matplotlib.image.imread(io.BytesIO(raw), format="png")
