"""Documents translated with their structure kept: a file read into the texts to translate, and written back
around their translations. Used by `transerve translate` (service/bulk/) and by LibreTranslate's
POST /translate_file (service/api/libretranslate_files.py); it knows no engine and no HTTP.

    limits.py       the bounds a hostile file meets (their defaults are service/config.py's) and DocumentError
    container.py    a zip read safely before any library sees it: entries, unpacked bytes, DTDs, elements, kind
    paragraphs.py   a paragraph's runs of text as translatable texts, and its runs' formatting put back
    word.py         .docx (python-docx)      slides.py  .pptx (python-pptx)
    opendocument.py .odt, .odp (zipfile + lxml)
    plain.py        .txt, .html (shared/html_text.py); catalog.py .po (polib, placeholders kept)
    subtitles.py    .srt, .vtt; markdown.py .md: streamed by `transerve translate` (records.py), read whole for
                    HTTP by streamed.py
    formats.py      which format a file is, and load(): the one entry point

A Document has `texts` (what to translate, in order) and `render(translations) -> bytes`.
"""
