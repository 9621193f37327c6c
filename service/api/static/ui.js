"use strict";
// The translate page (GET /ui): our JSON API from the browser, nothing else. Every text from the server or
// the user goes into the page as text (textContent, value), never as markup. Paths are relative, so the
// page works behind a proxy that serves the API under a prefix.
(() => {
  const $ = (id) => document.getElementById(id);
  const els = {
    keyRow: $("key-row"), key: $("key"), source: $("source"), target: $("target"), swap: $("swap"),
    detected: $("detected"), input: $("input"), output: $("output"), count: $("count"), clear: $("clear"),
    status: $("status"), copy: $("copy"), error: $("error"), glossary: $("glossary"),
    glossaryCount: $("glossary-count"), glossaryHeld: $("glossary-held"), glossaryBox: $("glossary-box"),
    glossaryId: $("glossary-id"),
  };
  const DELAY_MS = 400;                     // translate once typing pauses this long
  const KEY_STORE = "transerve.api_key";    // sessionStorage: gone with the tab
  const maxChars = Number(document.body.dataset.maxChars) || 0;
  let languages = [];                       // GET /languages: [{code, name, targets}]
  let timer = 0;
  let controller = null;                    // the request in flight, aborted by the next one
  let seq = 0;                              // only the latest request's answer is shown
  let detectedCode = "";                    // what "auto" found in the text shown
  let stored = [];                          // GET /glossaries: the key's stored glossaries, once the box opens

  const nameOf = (code) => (languages.find((l) => l.code === code) || {}).name || code;

  function option(value, label) {
    const o = document.createElement("option");
    o.value = value;
    o.textContent = label;
    return o;
  }

  function headers() {
    const h = { "Content-Type": "application/json" };
    const key = els.key.value.trim();
    if (key) h.Authorization = "Bearer " + key;
    return h;
  }

  async function call(path, init) {
    const r = await fetch(path, init);
    const json = (r.headers.get("content-type") || "").includes("json");
    return { ok: r.ok, status: r.status, body: json ? await r.json() : await r.text() };
  }

  // The API's errors as it gives them: {"error": {"type", "message", "limit"?}, "request_id"}.
  function showError(status, body) {
    const e = body && body.error;
    let text;
    if (e && typeof e === "object") {
      text = `${status} ${e.type}: ${e.message}`;
      if (e.limit !== undefined && e.limit !== null) text += ` (limit ${e.limit})`;
      if (body.request_id) text += `\nrequest id: ${body.request_id}`;
    } else {
      text = `${status}: ${typeof body === "string" ? body : JSON.stringify(body)}`;
    }
    els.error.textContent = text;
    els.error.hidden = false;
    els.glossaryHeld.textContent = "";
    if (status === 401 || status === 403) {
      els.keyRow.hidden = false;
      els.key.focus();
    }
  }

  function clearError() {
    els.error.hidden = true;
    els.error.textContent = "";
  }

  function showOutput(text, detected, status) {
    if (!detected) detectedCode = "";
    els.output.value = text;
    els.copy.disabled = !text;
    els.detected.textContent = detected;
    els.status.textContent = status;
  }

  function fillTargets() {
    const source = els.source.value;
    const keep = els.target.value;
    const codes = new Set();
    for (const l of languages) {
      if (source === "auto" || l.code === source) l.targets.forEach((t) => codes.add(t));
    }
    if (source !== "auto") codes.add(source);   // a language into itself: the text unchanged
    const sorted = [...codes].sort();
    els.target.replaceChildren(...sorted.map((c) => option(c, nameOf(c))));
    const pick = [keep, "en", sorted.find((c) => c !== source)].find((c) => c && codes.has(c));
    if (pick) els.target.value = pick;
  }

  async function loadLanguages() {
    let r;
    try {
      r = await call("languages", { headers: headers() });
    } catch (err) {
      showError("network error", String(err.message || err));
      return;
    }
    if (!r.ok) {
      showError(r.status, r.body);
      return;
    }
    languages = r.body;
    els.source.replaceChildren(option("auto", "Detect language"), ...languages.map((l) => option(l.code, l.name)));
    fillTargets();
    if (els.input.value.trim()) translate();
  }

  // The glossary box: a line is "source<TAB>target" (DeepL's TSV) or "source = target"; blank lines skipped. A
  // line of another shape is sent as it is, for the API to name it (400 invalid_glossary, entry n).
  function glossaryEntries() {
    const out = [];
    for (const line of els.glossary.value.split("\n")) {
      if (!line.trim()) continue;
      const cut = line.includes("\t") ? line.split("\t") : line.split(" = ");
      out.push({ source: cut[0] || "", target: cut.slice(1).join(" = ") });
    }
    els.glossaryCount.textContent = out.length ? `(${out.length})` : "";
    return out;
  }

  // The key's stored glossaries (GET /glossaries) for the pair chosen: one is for one language pair, and needs
  // a source language (not "auto"), as /translate's glossary_id does. Listed when the box opens or the key
  // changes; a key that may not list them leaves the list at "none" (translating shows any error).
  async function loadGlossaries() {
    try {
      const r = await call("glossaries", { headers: headers() });
      stored = r.ok ? r.body.glossaries : [];
    } catch (err) {
      stored = [];
    }
    fillGlossaries();
  }

  function fillGlossaries() {
    const keep = els.glossaryId.value;
    const fits = stored.filter((g) => g.source_lang === els.source.value && g.target_lang === els.target.value);
    els.glossaryId.replaceChildren(option("", "none"),
      ...fits.map((g) => option(g.glossary_id, `${g.name} (${g.entry_count} ${g.entry_count === 1 ? "entry" : "entries"})`)));
    if (fits.some((g) => g.glossary_id === keep)) els.glossaryId.value = keep;
  }

  function showHeld(item) {
    const results = item.glossary || [];
    const missed = results.filter((g) => !g.held).map((g) => `${g.source} → ${g.target}`);
    els.glossaryHeld.textContent = !results.length ? "" : missed.length
      ? `${results.length - missed.length} of ${results.length} terms held; missed: ${missed.join(", ")}`
      : `${results.length} of ${results.length} terms held`;
  }

  function updateCount() {
    const n = els.input.value.length;
    els.count.textContent = maxChars ? `${n} / ${maxChars}` : String(n);
  }

  function schedule() {
    updateCount();
    clearTimeout(timer);
    timer = setTimeout(translate, DELAY_MS);
  }

  async function translate() {
    clearTimeout(timer);
    if (controller) controller.abort();
    const text = els.input.value;
    const mine = ++seq;
    if (!text.trim()) {
      clearError();
      showOutput("", "", "");
      return;
    }
    controller = new AbortController();
    els.status.textContent = "Translating…";
    const request = { text, source_lang: els.source.value, target_lang: els.target.value };
    const glossary = glossaryEntries();
    if (glossary.length) request.glossary = glossary;
    if (els.glossaryId.value) request.glossary_id = els.glossaryId.value;   // with entries too: the API's 422
    const body = JSON.stringify(request);
    let r;
    try {
      r = await call("translate", { method: "POST", headers: headers(), body, signal: controller.signal });
    } catch (err) {
      if (mine === seq && err.name !== "AbortError") {
        showOutput("", "", "");
        showError("network error", String(err.message || err));
      }
      return;
    }
    if (mine !== seq) return;
    if (!r.ok) {
      showOutput("", "", "");
      showError(r.status, r.body);
      return;
    }
    clearError();
    const item = r.body.translations[0];
    showHeld(item);
    const d = item.detected_lang;
    detectedCode = d ? d.language : "";
    showOutput(item.text, d ? `Detected: ${nameOf(d.language)} (${Math.round(d.confidence)}%)` : "",
               `${r.body.model} · ${Math.round(r.body.timings.total_ms)} ms`);
  }

  async function copy() {
    const text = els.output.value;
    try {
      await navigator.clipboard.writeText(text);
    } catch (err) {                          // no clipboard API (plain http on another host): the old way
      els.output.select();
      document.execCommand("copy");
    }
    els.copy.textContent = "Copied";
    setTimeout(() => { els.copy.textContent = "Copy"; }, 1500);
  }

  function swap() {
    const from = els.source.value === "auto" ? detectedCode : els.source.value;
    if (!from) return;                       // "auto" with nothing detected yet
    const to = els.target.value;
    els.source.value = to;
    fillTargets();
    els.target.value = from;
    fillGlossaries();
    if (els.output.value) els.input.value = els.output.value;
    updateCount();
    translate();
  }

  els.key.value = sessionStorage.getItem(KEY_STORE) || "";
  if (document.body.dataset.keyRequired === "true" || els.key.value) els.keyRow.hidden = false;
  els.key.addEventListener("change", () => {
    sessionStorage.setItem(KEY_STORE, els.key.value.trim());
    if (!languages.length) loadLanguages(); else translate();
    if (els.glossaryBox.open) loadGlossaries();
  });
  els.input.addEventListener("input", schedule);
  els.glossary.addEventListener("input", schedule);
  els.glossaryBox.addEventListener("toggle", () => { if (els.glossaryBox.open) loadGlossaries(); });
  els.glossaryId.addEventListener("change", translate);
  els.input.addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) translate(); });
  els.source.addEventListener("change", () => { fillTargets(); fillGlossaries(); translate(); });
  els.target.addEventListener("change", () => { fillGlossaries(); translate(); });
  els.swap.addEventListener("click", swap);
  els.copy.addEventListener("click", copy);
  els.clear.addEventListener("click", () => { els.input.value = ""; updateCount(); translate(); els.input.focus(); });
  updateCount();
  loadLanguages();
})();
