"""transerve translate (service/bulk/), run as the command it is (a subprocess of `python -m service.cli`, which
pyproject installs as `transerve`) on models/de-en with greedy search and one thread: its output line for line
equal to the engine's own answers for the same options, every format's structure kept, --resume after a
SIGTERM finishing the rest without redoing it, stdin to stdout, and --url through a running service."""

import io
import json
import re
import signal
import subprocess
import sys
import time
import tomllib
import zipfile

import docx
import polib
import pytest
from lxml import etree

from conftest import ROOT, free_port, pairs64, start_server, stop_server
from documents_help import opendocument, word
from service.bulk.formats import JsonLines
from service.bulk.options import BulkOptions

MODEL = ROOT / "models" / "de-en"
GERMAN = [de for de, _ in pairs64()]
GREEDY = ["--beam-size", "1", "--threads", "1"]


def transerve(*args, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "service.cli", *map(str, args)], cwd=ROOT, input=stdin,
                          capture_output=True, text=True, timeout=timeout)


def translate(*args, **kw) -> subprocess.CompletedProcess:
    proc = transerve("translate", "--model", MODEL, *GREEDY, *args, **kw)
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def engine():
    from service.inference.engine import Engine

    return Engine(MODEL, intra_op_threads=1)


@pytest.fixture(scope="module")
def reference(engine) -> dict[str, str]:
    """The engine's greedy answer for each fixture sentence (each is one sentence: the command's unit)."""
    from service.shared.text import split_sentences

    assert all(len(split_sentences(t)[0]) == 1 for t in GERMAN)
    out = engine.translate(GERMAN, source_lang="de", target_lang="en", beam_size=1, max_length=engine.max_positions)
    return dict(zip(GERMAN, (t.text for t in out)))


def test_lines_equal_the_engine_blank_lines_kept_and_chunks_written_in_order(tmp_path, reference):
    lines = GERMAN[:40]
    lines[3:3] = [""]
    lines[20:20] = ["   "]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    # chunks of 8: each sorted by length for the engine, written back in input order
    proc = translate(src, "-o", tmp_path / "out.txt", "--chunk", "8", "--batch-size", "4")
    out = (tmp_path / "out.txt").read_text(encoding="utf-8").split("\n")
    assert out[-1] == "" and len(out) - 1 == len(lines)
    assert out[:-1] == [reference[t] if t.strip() else t for t in lines]
    assert "done: 42/42 segments" in proc.stderr and "\r" not in proc.stderr   # not a terminal: lines, no bar
    assert not (tmp_path / "out.txt.transerve-state.json").exists()


def test_stdin_to_stdout_a_tsv_column_by_header_name(reference):
    rows = ["id\tde\tnote"] + [f"{i}\t{de}\tx" for i, de in enumerate(GERMAN[:6])] + ["6\t\ty"]
    proc = translate("--format", "tsv", "--header", "--column", "de", stdin="\n".join(rows) + "\n")
    out = [line.split("\t") for line in proc.stdout.splitlines()]
    assert out[0] == ["id", "de", "note"]
    assert out[1:7] == [[str(i), reference[de], "x"] for i, de in enumerate(GERMAN[:6])]
    assert out[7] == ["6", "", "y"]


def test_a_csv_column_with_quoted_cells(tmp_path, reference):
    import csv

    src = tmp_path / "in.csv"
    with open(src, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([["a, b", de, 'say "hi"'] for de in GERMAN[:4]])
    translate(src, "-o", tmp_path / "out.csv", "--column", "2")
    with open(tmp_path / "out.csv", newline="", encoding="utf-8") as f:
        assert list(csv.reader(f)) == [["a, b", reference[de], 'say "hi"'] for de in GERMAN[:4]]


def test_a_jsonl_field_to_another_field(tmp_path, reference):
    rows = [{"id": i, "de": de, "meta": {"k": [1, "ü"]}} for i, de in enumerate(GERMAN[:5])] + [{"id": 9}]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    translate(src, "-o", tmp_path / "out.jsonl", "--field", "de", "--to-field", "en")
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]
    assert out[:5] == [r | {"en": reference[r["de"]]} for r in rows[:5]]
    assert out[5] == {"id": 9, "en": ""}


@pytest.mark.parametrize("to_field", [None, "en"])
def test_jsonl_lines_that_are_not_objects_with_the_field_are_copied_as_written(to_field):
    """Other JSON values (null, a number, an array) come back byte for byte, and so does an object without the
    field (--to-field gives it an empty column); an object whose field is translated and which holds a number a
    float cannot hold (1e400 would come back as `Infinity`, which is not JSON) is refused naming its line."""
    lines = ['null\n', '42\n', '["ab", "cd"]\n', '{"g": 1e400,  "t": 1.50}\n', '{"text": "Hallo", "n": 1.5e3}\n']
    fmt = JsonLines(BulkOptions(format="jsonl", to_field=to_field))
    if to_field:
        lines[3] = '{"g": 2.5}\n'
    records = list(fmt.read(io.StringIO("".join(lines))))
    out = [fmt.write(r, r.segment.upper()) for r in records]
    assert [r.segment for r in records] == ["", "", "", "", "Hallo"]
    assert out[:3] == lines[:3]
    assert out[3] == lines[3] if to_field is None else json.loads(out[3]) == {"g": 2.5, "en": ""}
    assert json.loads(out[4]) == ({"text": "Hallo", "n": 1500.0, "en": "HALLO"} if to_field else
                                  {"text": "HALLO", "n": 1500.0})
    with pytest.raises(ValueError, match="line 2 cannot be written back as JSON"):
        list(fmt.read(io.StringIO('{"x": 1}\n{"text": "Hallo", "f": 1e400}\n')))


def catalog(path):
    po = polib.POFile(wrapwidth=0)
    po.metadata = {"Content-Type": "text/plain; charset=UTF-8", "Plural-Forms": "nplurals=2; plural=(n != 1);"}
    po.append(polib.POEntry(msgid=GERMAN[0], occurrences=[("app.c", "12")], comment="a comment"))
    po.append(polib.POEntry(msgid=f"%s: {GERMAN[1]} <b>{GERMAN[2]}</b>\n%(name)s {{count}} &amp; 100%%",
                            flags=["python-format"]))
    po.append(polib.POEntry(msgid="%d Datei", msgid_plural="%d Dateien", msgstr_plural={0: "", 1: ""}))
    po.append(polib.POEntry(msgid=GERMAN[3], msgstr="Already translated."))
    po.append(polib.POEntry(msgid=GERMAN[4], msgstr="Old.", obsolete=True))
    po.save(str(path))


def test_a_po_catalog_filled_fuzzy_with_placeholders_and_markup_kept(tmp_path, reference):
    catalog(tmp_path / "in.pot")
    translate(tmp_path / "in.pot", "-o", tmp_path / "out.po")
    out = polib.pofile(str(tmp_path / "out.po"))
    first, marked, plural, done = out[0], out[1], out[2], out[3]
    assert first.msgstr == reference[GERMAN[0]] and "fuzzy" in first.flags
    assert first.occurrences == [("app.c", "12")] and first.comment == "a comment"
    # each placeholder, tag, entity and line break where it was; the runs between translated one by one
    assert marked.msgstr == (f"%s: {reference[GERMAN[1]]} <b>{reference[GERMAN[2]]}</b>\n%(name)s {{count}} "
                             "&amp; 100%%")
    assert set(marked.flags) == {"python-format", "fuzzy"}
    assert plural.msgstr_plural[0].startswith("%d ") and plural.msgstr_plural[1].startswith("%d ")
    assert all(len(s) > 3 for s in plural.msgstr_plural.values()) and "fuzzy" in plural.flags
    assert done.msgstr == "Already translated." and "fuzzy" not in done.flags
    assert out.obsolete_entries()[0].msgstr == "Old."
    assert out.metadata["Plural-Forms"] == "nplurals=2; plural=(n != 1);"


def test_resume_after_sigterm_finishes_the_rest_without_redoing_it(tmp_path, reference):
    lines = GERMAN * 6      # 384 lines, chunks of 16
    src, dst = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("".join(t + "\n" for t in lines), encoding="utf-8")
    state = tmp_path / "out.txt.transerve-state.json"
    cmd = [sys.executable, "-m", "service.cli", "translate", src, "-o", dst, "--model", MODEL, *GREEDY,
           "--chunk", "16"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (state.exists() and json.loads(state.read_text())["records"] >= 96) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143, proc.stderr.read()
    assert "stopped by SIGTERM" in proc.stderr.read()
    done = json.loads(state.read_text())["records"]
    assert 96 <= done < len(lines)
    finished = translate(src, "-o", dst, "--chunk", "16", "--resume")
    assert f"done: {len(lines)}/{len(lines)} segments" in finished.stderr
    assert f"(resumed after {done})" in finished.stderr
    assert dst.read_text(encoding="utf-8").splitlines() == [reference[t] for t in lines]
    assert not state.exists()
    # a finished output is not resumed again (it would be redone): refused, named
    again = transerve("translate", src, "-o", dst, "--model", MODEL, "--resume")
    assert again.returncode == 2 and "complete" in again.stderr


def test_url_through_a_running_service_equals_in_process(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("".join(t + "\n" for t in GERMAN[:24]) + "\n", encoding="utf-8")
    local = translate(src, "--beam-size", "2").stdout
    proc, url = start_server(MODEL)
    try:
        remote = translate(src, "--beam-size", "2", "--url", url, "--concurrency", "3", "--batch-size", "5").stdout
    finally:
        stop_server(proc)
    assert remote == local and remote.endswith("\n\n")


def test_a_glossary_file_keeps_its_terms_in_process_and_through_a_service(tmp_path):
    """--glossary, DeepL's TSV or CSV, at the service's default beam: its terms written where a sentence holds
    them, the other sentences as without it; --url sends it as POST /translate's glossary, with the same answer,
    and a glossary the service refuses is told before anything is written."""
    src = tmp_path / "in.txt"
    src.write_text("Der Auftrag wurde gestern erteilt.\nDas Haus ist groß.\nEs regnet.\n", encoding="utf-8")
    (tmp_path / "g.tsv").write_text("Auftrag\tpurchase order\nHaus\tbuilding\n", encoding="utf-8")
    (tmp_path / "g.csv").write_text('Auftrag,purchase order\n"Haus",building\n', encoding="utf-8")
    (tmp_path / "bad.tsv").write_text("Dach\t屋根\n", encoding="utf-8")          # de-en cannot write it
    beam = ["--beam-size", "4"]
    plain = translate(src, *beam).stdout.splitlines()
    local = translate(src, *beam, "--glossary", tmp_path / "g.tsv").stdout
    kept = local.splitlines()
    assert "purchase order" in kept[0] and "purchase order" not in plain[0] and "building" in kept[1]
    assert kept[2] == plain[2]
    assert translate(src, *beam, "--glossary", tmp_path / "g.csv").stdout == local
    proc, url = start_server(MODEL)
    try:
        remote = translate(src, *beam, "--glossary", tmp_path / "g.tsv", "--url", url).stdout
        refused = transerve("translate", src, "-o", tmp_path / "out.txt", "--glossary", tmp_path / "bad.tsv",
                            "--url", url)
    finally:
        stop_server(proc)
    assert remote == local
    assert refused.returncode == 2 and "glossary entry 1: its target term has characters" in refused.stderr
    assert not (tmp_path / "out.txt").exists()


def test_a_glossary_that_cannot_be_used_is_refused_naming_why(tmp_path):
    (tmp_path / "g.tsv").write_text("Auftrag\torder\nHaus\tbuilding\tx\n", encoding="utf-8")
    (tmp_path / "g.txt").write_text("Auftrag\torder\n", encoding="utf-8")
    (tmp_path / "unwritable.tsv").write_text("Dach\t屋根\n", encoding="utf-8")
    for args, words in [(["--glossary", tmp_path / "g.tsv"], "g.tsv: glossary line 2: 3 fields"),
                        (["--glossary", tmp_path / "g.txt"], "a glossary is a .tsv file"),
                        (["--glossary", tmp_path / "none.tsv"], "none.tsv: No such file"),
                        (["--glossary", tmp_path / "g.tsv", "--beam-size", "1"], "needs --beam-size 2 or more"),
                        (["--glossary", tmp_path / "unwritable.tsv", "--model", MODEL],
                         "glossary entry 1: its target term has characters de-en cannot write")]:
        proc = transerve("translate", "-", *args, stdin="Das Haus ist groß.\n")
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert words in proc.stderr.splitlines()[-1], proc.stderr


def test_subtitles_keep_numbers_timings_tags_and_speakers(tmp_path, reference):
    a, b, c, d = GERMAN[:4]
    one, two = a.split(" ", 2)[:2], a.split(" ", 2)[2]
    srt = (f"1\n00:00:01,000 --> 00:00:04,000\n{' '.join(one)}\n{two}\n\n"
           f"2\n00:00:05,000 --> 00:00:07,500\n<i>{b}</i>\n\n"
           f"3\n00:00:08,000 --> 00:00:09,000\n- {c}\n- {d}\n")
    (tmp_path / "in.srt").write_text(srt, encoding="utf-8")
    translate(tmp_path / "in.srt", "-o", tmp_path / "out.srt")
    cues = [cue.split("\n") for cue in (tmp_path / "out.srt").read_text(encoding="utf-8").split("\n\n")]
    assert [cue[:2] for cue in cues] == [["1", "00:00:01,000 --> 00:00:04,000"], ["2", "00:00:05,000 --> 00:00:07,500"],
                                         ["3", "00:00:08,000 --> 00:00:09,000"]]
    assert len(cues[0]) == 4 and " ".join(cues[0][2:]) == reference[a]     # one sentence, broken in two again
    assert cues[1][2:] == [f"<i>{reference[b]}</i>"]
    assert cues[2][2:] == [f"- {reference[c]}", f"- {reference[d]}", ""]   # a line per speaker
    vtt = (f"WEBVTT\n\nNOTE made by hand\n\nintro\n00:01.000 --> 00:04.000 align:start line:0\n<v Anna>{b}\n\n"
           f"00:05.000 --> 00:06.000\n\n")
    (tmp_path / "in.vtt").write_text(vtt, encoding="utf-8")
    translate(tmp_path / "in.vtt", "-o", tmp_path / "out.vtt")
    assert (tmp_path / "out.vtt").read_text(encoding="utf-8") == vtt.replace(b, reference[b])


def test_markdown_keeps_its_blocks_and_inline_markup(tmp_path, reference):
    a, b, c, d = GERMAN[:4]
    first, rest = a.split(" ", 1)
    md = (f"# {b}\n\n{first}\n{rest}\n\n- **{c}**\n- [ ] [{d}](https://example.org/a_b) `rm -rf`\n\n> {b}\n\n"
          f"```python\nprint('{c}')\n```\n\n| {c} | 42 |\n|---|---|\n\n    {d}\n")
    (tmp_path / "in.md").write_text(md, encoding="utf-8")
    translate(tmp_path / "in.md", "-o", tmp_path / "out.md")
    r = reference
    assert (tmp_path / "out.md").read_text(encoding="utf-8") == (
        f"# {r[b]}\n\n{r[a]}\n\n- **{r[c]}**\n- [ ] [{r[d]}](https://example.org/a_b) `rm -rf`\n\n> {r[b]}\n\n"
        f"```python\nprint('{c}')\n```\n\n| {r[c]} | 42 |\n|---|---|\n\n    {d}\n")


def test_html_keeps_its_markup(tmp_path, reference):
    a, b, c, d = GERMAN[:4]
    page = (f"<!doctype html>\n<html><head><title>{a}</title><style>p {{color: red}}</style></head>\n"
            f"<body><p class='x'>{b} {c}</p><p><b>{d}</b></p>\n<pre>{a}</pre><p translate=\"no\">{b}</p>"
            f"<!-- {c} --></body></html>\n")
    (tmp_path / "in.html").write_text(page, encoding="utf-8")
    translate(tmp_path / "in.html", "-o", tmp_path / "out.html")
    r = reference
    out = (tmp_path / "out.html").read_text(encoding="utf-8")
    bold = re.search(r"<p><b>(.*?)</p>", out).group(1)      # html_text may leave end punctuation outside </b>
    assert bold.replace("</b>", "") == r[d] and bold.count("</b>") == 1
    assert out.replace(bold, "{bold}") == (
        f"<!doctype html>\n<html><head><title>{r[a]}</title><style>p {{color: red}}</style></head>\n"
        f"<body><p class='x'>{r[b]} {r[c]}</p><p><b>{{bold}}</p>\n<pre>{a}</pre><p translate=\"no\">{b}</p>"
        f"<!-- {c} --></body></html>\n")


def test_batches_are_cut_at_sentences_or_padded_tokens_and_sorted_by_length():
    from service.bulk.translators import batches

    ids = [[1] * n for n in (5, 3, 100, 3, 40, 41)]
    # 3 sentences at most, 90 padded tokens at most; the 100-token sentence goes alone
    assert batches(ids, 3, 90) == [[1, 3, 0], [4, 5], [2]]
    assert batches(ids, 32, 10_000) == [[1, 3, 0, 4, 5, 2]]


def test_progress_is_a_bar_on_a_terminal_and_lines_otherwise():
    import io

    from service.bulk.progress import Progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    bar, lines = Terminal(), io.StringIO()
    for stream in (bar, lines):
        p = Progress("auto", 100, stream=stream, every=0)
        p.start = p.shown = p.start - 2      # two seconds in
        p.update(25, 500)
        p.finish()
    assert "\r\x1b[Ktranserve translate: [#######.......................]  25.0% 25/100 segments" in bar.getvalue()
    assert lines.getvalue().splitlines()[0] == ("transerve translate: 25/100 segments, 12.5 segments/s, 250 tokens/s, "
                                                "ETA 0:00:06")
    assert "\r" not in lines.getvalue() and lines.getvalue().splitlines()[1].startswith("transerve translate: done: 25")


def test_options_are_the_apis_and_refused_as_it_refuses_them():
    bad = transerve("translate", "--beam-size", "0")
    assert bad.returncode == 2 and "beam_size" in bad.stderr and "greater than or equal to 1" in bad.stderr
    help_text = transerve("translate", "--help").stdout
    for flag in ("--beam-size", "--length-penalty", "--max-length", "--no-repeat-ngram-size",
                 "--repetition-penalty", "--resume", "--url", "--column", "--field"):
        assert flag in help_text
    max_length = " ".join(help_text.rsplit("--max-length MAX_LENGTH", 1)[1].split("--no-repeat")[0].split())
    assert max_length.count("default") == 1, max_length         # one default, the schema's own words


def test_ctrl_c_says_it_was_stopped_by_sigint(tmp_path, monkeypatch, capsys):
    """A KeyboardInterrupt has no text (but is truthy): the message named nothing after "stopped by"."""
    from service.bulk import command

    def interrupted(options, translator):
        raise KeyboardInterrupt
    monkeypatch.setattr(command, "runner", lambda fmt: interrupted)
    monkeypatch.setattr("service.bulk.translators.translator", lambda options: None)
    src = tmp_path / "in.txt"
    src.write_text("Hallo\n", encoding="utf-8")
    assert command.main([str(src), "-o", str(tmp_path / "out.txt"), "--model", str(MODEL)]) == 130
    assert capsys.readouterr().err.strip() == "transerve translate: stopped by SIGINT"


def test_a_service_that_cannot_be_reached_ends_the_run_with_a_message_to_resume(tmp_path, monkeypatch, capsys):
    """--url: what the SDK gives up on (here a port nobody listens on, its retries not slept) is exit 2 with the
    service's or the connection's words, not a traceback."""
    from service.bulk import command

    monkeypatch.setattr("service.client.time.sleep", lambda seconds: None)
    src = tmp_path / "in.txt"
    src.write_text("Hallo\n", encoding="utf-8")
    url = f"http://127.0.0.1:{free_port()}"
    assert command.main([str(src), "-o", str(tmp_path / "out.txt"), "--url", url, "--progress", "off"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"transerve translate: error: {url}: POST /translate: ConnectError") and "--resume" in err


@pytest.mark.parametrize("name, content, words", [
    ("empty.txt", "", "the file is empty"),
    ("blank.srt", "\n\n", "the file is empty (only whitespace)"),
    ("empty.md", "", "the file is empty"),
    ("empty.html", "", "the file is empty"),
    ("empty.po", "", "the file is empty"),
    ("cut.po", 'msgid "Hallo\nmsgstr ""\n', "the .po file's msgid on line 1 is not terminated"),
    ("dtd.html", '<!DOCTYPE html [ <!ENTITY b "x"> ]><p>Hallo &b;</p>', "internal DTD subset"),
    ("-", "", "the file is empty"),
])
def test_an_empty_or_malformed_file_is_refused_with_a_message_not_a_traceback(tmp_path, name, content, words):
    """As the service refuses the upload (tests/test_documents.py), before anything is sent or written: --url
    names a port nobody listens on, so no model loads and a file that got as far as translating would fail."""
    if name != "-":
        (tmp_path / name).write_text(content, encoding="utf-8")
    source = ["--format", "srt"] if name == "-" else [tmp_path / name]      # "-": standard input
    proc = transerve("translate", *source, "-o", tmp_path / "out", "--url", "http://127.0.0.1:9", stdin=content,
                     timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("transerve translate: error: ") and words in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_the_console_script_has_both_commands():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"transerve": "service.cli:main"}
    assert "serve" in transerve("--help").stdout and "translate" in transerve("--help").stdout
    serve = transerve("serve", "--help")
    assert serve.returncode == 0 and "--model" in serve.stdout and "--workers" in serve.stdout
    assert transerve("nonsense").returncode == 2


def test_a_docx_and_an_odt_through_the_command_keep_their_structure(tmp_path, reference):
    """Documents (service/documents/) in-process: a header, a table and a bold run in a .docx, a heading and a
    master page's header in an .odt, each paragraph the engine's answer."""
    src = tmp_path / "in.docx"
    src.write_bytes(word((GERMAN[0] + " ", GERMAN[1], ""), GERMAN[2], [[GERMAN[3], GERMAN[4]]]))
    translate(src, "-o", tmp_path / "out.docx")
    d = docx.Document(str(tmp_path / "out.docx"))
    assert [r.bold for r in d.paragraphs[0].runs] == [None, True, None] and d.paragraphs[0].runs[1].text
    assert " ".join(d.paragraphs[0].text.split()) == f"{reference[GERMAN[0]]} {reference[GERMAN[1]]}"
    assert d.sections[0].header.paragraphs[0].text == reference[GERMAN[2]]
    assert [c.text for c in d.tables[0].rows[0].cells] == [reference[GERMAN[3]], reference[GERMAN[4]]]
    (tmp_path / "in.odt").write_bytes(opendocument(GERMAN[5], (GERMAN[6], "", ""), GERMAN[7], GERMAN[8]))
    translate(tmp_path / "in.odt", "-o", tmp_path / "out.odt")
    z = zipfile.ZipFile(tmp_path / "out.odt")
    ns = {"text": "urn:oasis:names:tc:opendocument:xmlns:text:1.0"}
    assert etree.fromstring(z.read("content.xml")).xpath("string(//text:h)", namespaces=ns) == reference[GERMAN[5]]
    assert etree.fromstring(z.read("styles.xml")).xpath("string(//text:p)", namespaces=ns) == reference[GERMAN[8]]
