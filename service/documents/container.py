"""A zip container (docx, pptx, odt, odp) read safely, before any document library sees it.

Every entry is decompressed once, as a stream, and counted as it comes: the entries, their bytes (the declared
sizes of a zip bomb can lie, the counted ones cannot) and, in XML parts, the start tags (a document of a
million runs is refused before lxml builds a million elements) and any DTD. No OOXML or ODF part has a
DOCTYPE, and a DTD is what XML entity expansion ("billion laughs") and external entities need: refusing it
is simpler and safer than trusting each library's parser settings. Parts not in UTF-8 are refused too, so the
DTD cannot hide in UTF-16. Then the container must be what its extension says (a .docx holds
word/document.xml, an .odt says so in its mimetype entry)."""

from __future__ import annotations

import io
import zipfile

from .limits import DocumentError, Limits

CHUNK = 1 << 16
EXPECTED = {   # extension -> (the entry that makes it that kind, what that entry must hold; None: only be there)
    "docx": ("word/document.xml", None),
    "pptx": ("ppt/presentation.xml", None),
    "odt": ("mimetype", b"application/vnd.oasis.opendocument.text"),
    "odp": ("mimetype", b"application/vnd.oasis.opendocument.presentation"),
}
NAMES = {"docx": "a Word document (.docx)", "pptx": "a PowerPoint presentation (.pptx)",
         "odt": "an OpenDocument text (.odt)", "odp": "an OpenDocument presentation (.odp)"}


def open_zip(data: bytes, kind: str, limits: Limits) -> zipfile.ZipFile:
    """`data` as a checked ZipFile of `kind`, or a DocumentError naming what is wrong."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        entries = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError) as e:
        raise DocumentError(400, "not_a_document", f"the file is not {NAMES[kind]}: not a zip archive",
                            detail=str(e)) from None
    if len(entries) > limits.max_entries:
        raise DocumentError(413, "too_many_entries", f"the archive has {len(entries)} entries; the limit is "
                            f"{limits.max_entries}", limits.max_entries)
    declared = sum(e.file_size for e in entries)
    if declared > limits.max_unpacked_bytes:
        raise too_much_unpacked(f"declares {declared} bytes unpacked", limits)
    Counter(archive, limits).read_all(entries)
    check_kind(archive, kind)
    return archive


def too_much_unpacked(what: str, limits: Limits) -> DocumentError:
    return DocumentError(413, "unpacked_too_large", f"the archive {what}; the limit is {limits.max_unpacked_bytes} "
                         "(a zip bomb?)", limits.max_unpacked_bytes)


class Counter:
    """Reads every entry once, counting the unpacked bytes and the XML parts' start tags, and looking for DTDs."""

    def __init__(self, archive: zipfile.ZipFile, limits: Limits):
        self.archive, self.limits = archive, limits
        self.unpacked = self.elements = 0

    def read_all(self, entries: list[zipfile.ZipInfo]) -> None:
        for entry in entries:
            try:
                self.read(entry)
            except (zipfile.BadZipFile, NotImplementedError, RuntimeError, OSError, EOFError,
                    zipfile.zlib.error) as e:   # a bad CRC, an unknown compression, an encrypted entry
                raise DocumentError(400, "broken_archive", "an entry of the archive cannot be read (a bad CRC, an "
                                    "unknown compression or an encrypted entry)", detail=f"{entry.filename!r}: {e}") \
                    from None

    def read(self, entry: zipfile.ZipInfo) -> None:
        xml = entry.filename.endswith((".xml", ".rels"))
        carry, first = b"", True
        with self.archive.open(entry) as stream:
            while chunk := stream.read(CHUNK):
                self.unpacked += len(chunk)
                if self.unpacked > self.limits.max_unpacked_bytes:
                    raise too_much_unpacked(f"unpacks to more than {self.limits.max_unpacked_bytes} bytes", self.limits)
                if xml:
                    carry, first = self.scan(entry.filename, carry + chunk, first), False

    def scan(self, name: str, buf: bytes, first: bool) -> bytes:
        """Counts the start tags in buf and looks for a DTD; returns the bytes to look at again with the next
        chunk (a tag or keyword cut at the chunk's end)."""
        if first and (buf[:2] in (b"\xff\xfe", b"\xfe\xff") or b"\x00" in buf[:4]):
            raise DocumentError(400, "unsupported_encoding", "an XML part of the archive is not UTF-8; only UTF-8 "
                                "parts are read", detail=repr(name))
        keep = 9 if len(buf) > 9 else len(buf)          # len("<!DOCTYPE"): a keyword cut in two is seen whole
        if b"<!DOCTYPE" in buf or b"<!ENTITY" in buf:
            raise DocumentError(400, "xml_dtd", "an XML part of the archive declares a DTD (<!DOCTYPE or <!ENTITY>): "
                                "documents never need one, and entity expansion is refused", detail=repr(name))
        counted = buf[:-keep]                           # the kept tail is counted with the next chunk
        self.elements += counted.count(b"<") - counted.count(b"</") - counted.count(b"<?") - counted.count(b"<!")
        if self.elements > self.limits.max_elements:
            raise DocumentError(413, "too_many_elements", f"the document has more than {self.limits.max_elements} "
                                "XML elements (runs, paragraphs, cells...)", self.limits.max_elements)
        return buf[-keep:]


def check_kind(archive: zipfile.ZipFile, kind: str) -> None:
    entry, content = EXPECTED[kind]
    names = set(archive.namelist())
    if entry in names and (content is None or archive.read(entry).strip() == content):
        return
    actual = next((NAMES[k] for k, (e, c) in EXPECTED.items() if e in names and
                   (c is None or archive.read(e).strip() == c)), "no document this server translates")
    raise DocumentError(400, "wrong_kind", f"the file is named .{kind} but is {actual}: its content does not "
                        "match its extension")
