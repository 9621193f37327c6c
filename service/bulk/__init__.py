"""`transerve translate`: a file or standard input translated to a file or standard output, segment by segment.

    options.py      the command's options (the search options are POST /translate's, from shared/schemas.py)
    formats.py      the streamed formats: txt (a line each), a TSV/CSV column, a JSONL field (Record)
    po.py           gettext catalogs (.po/.pot): msgstr filled, placeholders and markup kept, entries fuzzy
    html.py         HTML (shared/html_text.py); document.py: docx, pptx, odt, odp (service/documents/, which also
                    holds srt/vtt and Markdown, streamed here cue by cue and block by block)
    translators.py  the engine in this process (inference/), or a running service through the SDK (client.py)
    run.py          the stream: chunks sorted by length for the engine, written back in order, resumable
    progress.py     the progress bar on a terminal, quiet lines otherwise (stderr)

It imports inference/, shared/ and the SDK, never the HTTP layers (docs/architecture.md); service/cli.py puts
it beside `serve` as the `transerve` console script. docs/bulk.md has the details.
"""
