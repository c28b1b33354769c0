// stepwise studio: the labelling page. Model-written text (questions, steps, answers,
// comments) is only ever put into the page as text nodes or through KaTeX with `trust: false`
// (no \href, \url, \includegraphics, \htmlData); nothing here uses innerHTML.
"use strict";

const REASONS = ["found_error", "solution", "bad_problem", "give_up"];
const state = { me: null, project: null, record: null, current: 0, keys: Promise.resolve(), guidelines: null };

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
  return e;
}

function status(text, bad) {
  const s = document.getElementById("status");
  s.textContent = text;
  s.className = bad ? "unsaved" : "";
}

// The current project's API route `rest` (`guidelines`, `mine`, `next`, …).
function projectApi(rest) { return "/api/projects/" + encodeURIComponent(state.project) + "/" + rest; }

async function api(method, path, body) {
  const opts = { method, headers: {}, credentials: "same-origin" };
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const res = await fetch(path, opts);
  let data = null;
  try { data = await res.json(); } catch (_) { data = null; }
  if (res.status === 401 && path !== "/api/login") { showLogin(); throw new Error("sign in first"); }
  if (!res.ok) throw new Error((data && data.error) || res.status + " " + res.statusText);
  return data;
}

// Text with LaTeX: $…$, $$…$$, \(…\), \[…\] rendered by KaTeX; the rest as text.
// Inline $…$ as pandoc reads it: no space inside either dollar and no digit right after the
// closing one, so a GSM8K step's "$1000 / $20" stays text.
const MATH = /\$\$([\s\S]+?)\$\$|\\\[([\s\S]+?)\\\]|\\\(([\s\S]+?)\\\)|\$(?=\S)([^$\n]*?\S)\$(?!\d)/g;
function rich(text, code) {
  const box = el("div", { class: "text" });
  if (code) {
    const pre = el("pre", { class: "code" });
    for (const line of String(text).split("\n")) pre.append(el("span", { class: "line" }, line));
    box.append(pre);
    return box;
  }
  let last = 0;
  text = String(text);
  for (const m of text.matchAll(MATH)) {
    if (m.index > last) box.append(text.slice(last, m.index));
    const tex = m[1] ?? m[2] ?? m[3] ?? m[4];
    const span = el("span");
    try {
      window.katex.render(tex, span, {
        displayMode: m[1] !== undefined || m[2] !== undefined, throwOnError: false, trust: false,
        strict: "ignore", maxExpand: 1000, maxSize: 20, output: "htmlAndMathml",
      });
    } catch (_) { span.textContent = m[0]; }
    box.append(span);
    last = m.index + m[0].length;
  }
  if (last < text.length) box.append(text.slice(last));
  return box;
}

function nav() {
  const n = document.getElementById("nav");
  n.replaceChildren();
  if (!state.me) return;
  n.append(el("a", { href: "#/label" }, "Label"));
  n.append(el("a", { href: "#/mine" }, "My records"));
  if (state.guidelines && state.guidelines.text) n.append(el("button", { type: "button", onclick: showGuidelines }, "Guidelines"));
  if (state.me.role !== "labeller") n.append(el("a", { href: "#/dashboard" }, "Dashboard"));
  n.append(el("span", {}, state.me.name + " (" + state.me.role + ")"));
  n.append(el("button", { type: "button", onclick: async () => { await api("POST", "/api/logout"); state.me = null; showLogin(); } }, "Sign out"));
}

function showLogin() {
  state.me = null; nav();
  const err = el("p", { class: "error", role: "alert" });
  const name = el("input", { id: "name", name: "name", autocomplete: "username", required: "" });
  const pw = el("input", { id: "password", name: "password", type: "password", autocomplete: "current-password", required: "" });
  const form = el("form", { class: "login", onsubmit: async (e) => {
    e.preventDefault(); err.textContent = "";
    try { await api("POST", "/api/login", { name: name.value, password: pw.value }); await start(); }
    catch (x) { err.textContent = x.message; pw.value = ""; pw.focus(); }
  } }, el("h1", {}, "Sign in"), el("label", { for: "name" }, "User name"), name,
     el("label", { for: "password" }, "Password"), pw, el("button", { type: "submit" }, "Sign in"), err);
  document.getElementById("main").replaceChildren(form);
  name.focus();
}

async function start() {
  state.me = await api("GET", "/api/me");
  state.project = state.project && state.me.projects.includes(state.project) ? state.project : state.me.projects[0];
  state.guidelines = state.project ? await api("GET", projectApi("guidelines")) : null;
  nav();
  route();
  // A labeller reads the guidelines before their first record, and again after each change.
  const g = state.guidelines;
  if (g && g.text && !(Number(localStorage.getItem(seenKey())) >= g.updated)) showGuidelines();
}

function seenKey() { return "stepwise-guidelines-seen:" + state.me.name + ":" + state.project; }

// The project's guidelines in a dialog, as text with math (written by an admin, but shown the
// same way as model-written text: text nodes and KaTeX without trust).
function showGuidelines() {
  const g = state.guidelines;
  if (!g || !g.text || document.querySelector("dialog[open]")) return;
  const d = el("dialog", { class: "guidelines", "aria-label": "Guidelines" }, el("h2", {}, "Guidelines"),
    el("p", { class: "keys" }, "Updated " + new Date(g.updated * 1000).toLocaleString() + " by " + g.set_by + ". Press g to read them again."),
    rich(g.text, false), el("button", { type: "button", onclick: () => d.close() }, "Close"));
  d.addEventListener("close", () => {
    try { localStorage.setItem(seenKey(), String(g.updated)); } catch (_) { /* private mode: shown again next time */ }
    d.remove();
    if (state.record) focusStep(state.current);
  });
  document.body.append(d); d.showModal();
}

function route() {
  const h = location.hash || "#/label";
  if (h.startsWith("#/dashboard")) return showDashboard();
  if (h.startsWith("#/mine")) return showMine();
  const r = h.match(/^#\/review\/(\d+)/);
  if (r) return showReview(Number(r[1]));
  const o = h.match(/^#\/record\/(\d+)/);
  if (o) return showRecord(Number(o[1])).catch((x) => {
    document.getElementById("main").replaceChildren(el("p", { class: "error", role: "alert" }, x.message));
  });
  return nextRecord();
}

// The labeller's own records, the latest first: any of them opens again to correct a rating.
async function showMine() {
  state.record = null;
  const { records } = await api("GET", projectApi("mine"));
  const when = (t) => new Date(t * 1000).toLocaleString();
  const rows = records.map((r) => el("tr", {}, el("td", {}, el("a", { href: "#/record/" + r.record }, r.ext_id)),
    el("td", {}, r.rated), el("td", {}, r.finished === null ? "open" : r.finish_reason + ", " + when(r.finished))));
  const main = document.getElementById("main");
  main.replaceChildren(el("h1", {}, "My records: " + state.project),
    el("p", { class: "keys" }, "Open one to correct it: a changed rating opens it again until you finish it once more."),
    records.length ? el("table", {}, el("thead", {}, el("tr", {}, ...["Record", "Steps rated", "Finished"].map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, ...rows)) : el("p", {}, "None yet."));
  main.focus();
}

// The record before the current one among the labeller's finished records (`p`).
async function previousRecord() {
  const { records } = await api("GET", projectApi("mine"));
  const done = records.filter((r) => r.finished !== null);
  const at = state.record ? done.findIndex((r) => r.record === state.record.id) : -1;
  const prev = at >= 0 ? done[at + 1] : done[0];
  if (!prev) { status("No earlier record of yours"); return; }
  location.hash = "#/record/" + prev.record;
}

async function nextRecord() {
  const main = document.getElementById("main");
  if (!state.project) { main.replaceChildren(el("p", {}, "No project yet: an admin starts one with `stepwise studio --input FILE`.")); return; }
  const { record } = await api("POST", projectApi("next"));
  if (/^#\/record\//.test(location.hash)) history.replaceState(null, "", "#/label");
  if (record === null) { state.record = null; main.replaceChildren(el("div", { class: "card" }, el("h1", {}, "All done"), el("p", {}, "Nothing is left in your queue for " + state.project + "."))); return; }
  await showRecord(record);
}

async function showRecord(id) {
  state.record = await api("GET", "/api/records/" + id);
  const firstUnrated = state.record.steps.findIndex((s) => s.rating === null);
  state.current = firstUnrated < 0 ? 0 : firstUnrated;
  drawRecord();
}

function firstBad(rec) { return rec.steps.findIndex((s) => s.rating === -1); }

function drawRecord() {
  const rec = state.record;
  const head = el("section", { class: "card", "aria-label": "Problem" },
    el("h1", {}, "Problem"), rich(rec.question, false));
  const grade = rec.correct === null ? "not graded" : rec.correct ? "right" : "wrong";
  head.append(el("div", { class: "meta" },
    el("span", {}, "Gold answer: ", rec.gold_answer === null ? "—" : rich(rec.gold_answer, false)),
    el("span", {}, "Final answer: ", rec.final_answer === null ? "—" : rich(rec.final_answer, false),
      " ", el("span", { class: rec.correct === null ? "" : rec.correct ? "grade-right" : "grade-wrong", id: "grade" }, "(" + grade + ")")),
    el("span", {}, rec.stop_at_first_bad ? "Stop at the first −1" : "Rate every step"),
    el("span", {}, "Record " + rec.ext_id),
    rec.finish_reason ? el("span", { id: "finished" }, "Finished: " + rec.finish_reason) : null));
  const list = el("ol", { class: "steps", "aria-label": "Steps" });
  const bad = firstBad(rec);
  rec.steps.forEach((s, i) => list.append(drawStep(s, i, bad)));
  const keys = el("p", { class: "keys" }, "Keys: ", el("kbd", {}, "1"), " −1  ", el("kbd", {}, "2"), " 0  ",
    el("kbd", {}, "3"), " +1  ", el("kbd", {}, "j"), "/", el("kbd", {}, "k"), " next/previous step  ",
    el("kbd", {}, "c"), " comment  ", el("kbd", {}, "w"), " write it right  ", el("kbd", {}, "f"), " finish  ", el("kbd", {}, "n"), " next record  ",
    el("kbd", {}, "p"), " previous record  ",
    ...(state.guidelines && state.guidelines.text ? [el("kbd", {}, "g"), " guidelines  "] : []), el("kbd", {}, "?"), " help");
  document.getElementById("main").replaceChildren(head, list, keys);
  focusStep(state.current);
}

function drawStep(s, i, bad) {
  const rec = state.record;
  const li = el("li", { class: "step", id: "step-" + i, tabindex: "-1", "aria-label": "Step " + (i + 1) });
  if (rec.stop_at_first_bad && bad >= 0 && i > bad) li.classList.add("after-error");
  const buttons = el("div", { class: "rate", role: "group", "aria-label": "Rating of step " + (i + 1) });
  for (const r of [-1, 0, 1]) {
    buttons.append(el("button", { type: "button", class: "r" + r, "aria-pressed": String(s.rating === r),
      onclick: () => { state.current = i; rate(r); } }, r > 0 ? "+1" : r === 0 ? "0" : "−1"));
  }
  li.append(el("span", { class: "n" }, String(i + 1)), rich(s.text, rec.code), buttons);
  const side = el("div", { class: "side" });
  if (rec.assist && s.suggestion !== null) {
    side.append(el("span", { class: "suggest", title: "The PRM's score for this step (a suggestion)" },
      "PRM ", el("meter", { min: "0", max: "1", value: String(s.suggestion) }), " " + s.suggestion.toFixed(2)));
  }
  side.append(el("span", { class: "save", id: "save-" + i }, s.rating === null ? "" : "saved"));
  if (s.comment) side.append(el("span", { class: "note" }, "Comment: ", s.comment));
  li.append(side);
  if (s.correction) li.append(el("div", { class: "correction", "aria-label": "Your correction of step " + (i + 1) },
    el("strong", {}, "Written right: "), rich(s.correction, rec.code)));
  if (s.alternatives.length) {
    const alts = el("div", { class: "alts", "aria-label": "Other candidate steps" });
    s.alternatives.forEach((a, k) => alts.append(el("div", { class: "alt" }, el("strong", {}, "Candidate " + (k + 2) + ": "), rich(a, rec.code))));
    li.append(alts);
  }
  return li;
}

function focusStep(i) {
  const n = state.record.steps.length;
  state.current = Math.max(0, Math.min(n - 1, i));
  document.querySelectorAll(".step.current").forEach((e) => e.classList.remove("current"));
  const li = document.getElementById("step-" + state.current);
  if (li) { li.classList.add("current"); li.focus({ preventScroll: true }); li.scrollIntoView({ block: "nearest" }); }
}

async function rate(r) {
  const rec = state.record, i = state.current;
  const mark = document.getElementById("save-" + i);
  mark.textContent = "saving…"; mark.className = "save";
  let saved;
  try {
    saved = await api("PUT", "/api/records/" + rec.id + "/steps/" + i, { rating: r });
    rec.steps[i].rating = r;
  } catch (x) {
    mark.textContent = "not saved: " + x.message; mark.className = "save unsaved";
    status("Not saved: " + x.message, true);
    return;
  }
  const bad = firstBad(rec);
  const li = document.getElementById("step-" + i);
  li.replaceWith(drawStep(rec.steps[i], i, bad));
  document.querySelectorAll(".step").forEach((e, k) => e.classList.toggle("after-error", rec.stop_at_first_bad && bad >= 0 && k > bad));
  document.getElementById("save-" + i).className = "save saved";
  status("Step " + (i + 1) + " saved");
  if (saved.reopened) {
    rec.finish_reason = null;
    const f = document.getElementById("finished");
    if (f) f.textContent = "Open again: finish it with f";
    status("Step " + (i + 1) + " saved; the record is open again until you finish it");
  }
  if (r === -1 && !saved.reopened && !rec.steps[i].correction) status("Step " + (i + 1) + " saved as wrong: w on it writes it right");
  if (rec.stop_at_first_bad && r === -1) return finishDialog("found_error");
  if (i + 1 < rec.steps.length) focusStep(i + 1);
  else { focusStep(i); finishDialog(rec.steps.some((s) => s.rating === -1) ? "found_error" : "solution"); }
}

function finishDialog(suggested) {
  const d = el("dialog", { id: "finish", "aria-label": "Finish this record" });
  const list = el("ol");
  REASONS.forEach((r, k) => list.append(el("li", {}, el("button", { type: "button", "data-reason": r,
    onclick: () => done(r) }, el("kbd", {}, String(k + 1)), " " + r))));
  d.append(el("h2", {}, "Finish"), el("p", {}, "Press a number, or Enter for ", el("strong", {}, suggested), "; Escape goes back."), list);
  const done = async (reason) => {
    d.close(); d.remove();
    try { await api("POST", "/api/records/" + state.record.id + "/finish", { finish_reason: reason }); }
    catch (x) { status("Not finished: " + x.message, true); return; }
    status("Finished: " + reason);
    state.record.finish_reason = reason;
    await nextRecord();
  };
  d.addEventListener("keydown", (e) => {
    // The dialog's keys are its own: the page's handler, which sees the dialog gone once a
    // reason is chosen, would otherwise rate the current step with the same digit.
    e.stopPropagation();
    const k = Number(e.key);
    if (k >= 1 && k <= 4) { e.preventDefault(); done(REASONS[k - 1]); }
    else if (e.key === "Enter") { e.preventDefault(); done(suggested); }
  });
  d.addEventListener("close", () => d.remove());
  document.body.append(d);
  d.showModal();
  d.focus();
}

// A text box under the current step for its comment (`c`) or its correction (`w`: the step
// as the labeller would write it); Enter saves, Shift+Enter a new line, Escape cancels.
function stepBox(field) {
  const i = state.current, li = document.getElementById("step-" + i);
  if (!li || li.querySelector("textarea")) return;
  const step = state.record.steps[i];
  const what = field === "comment" ? "Comment" : "Correction";
  const t = el("textarea", { rows: field === "comment" ? "2" : "4", class: field,
    "aria-label": field === "comment" ? "Comment on step " + (i + 1) : "Step " + (i + 1) + " written right" });
  t.value = step[field] || (field === "correction" ? step.text : "");
  t.addEventListener("keydown", async (e) => {
    e.stopPropagation();
    if (e.key === "Escape") { box.remove(); focusStep(i); }
    if (e.key === "Enter" && !e.shiftKey) {
      e.preventDefault();
      try {
        await api("PUT", "/api/records/" + state.record.id + "/steps/" + i, { rating: step.rating, [field]: t.value });
        // The server keeps no correction that is empty or the step as it stands.
        const none = field === "correction" && (!t.value.trim() || t.value.trim() === step.text.trim());
        step[field] = none ? null : t.value;
        li.replaceWith(drawStep(step, i, firstBad(state.record)));
        focusStep(i); status(what + (step[field] ? " saved" : " removed"));
      } catch (x) { status(what + " not saved: " + x.message, true); }
    }
  });
  const hint = field === "comment" ? "Enter saves, Shift+Enter a new line, Escape cancels"
    : "Write the step as it should be; Enter saves, Shift+Enter a new line, an empty box removes it, Escape cancels";
  const box = el("div", { class: "comment" }, t, el("span", { class: "keys" }, hint));
  li.append(box);
  t.focus();
}

function help() {
  const d = el("dialog", { "aria-label": "Keys" }, el("h2", {}, "Keys"), el("ul", {},
    el("li", {}, el("kbd", {}, "1"), " or ", el("kbd", {}, "-"), ": the step is wrong (−1)"),
    el("li", {}, el("kbd", {}, "2"), " or ", el("kbd", {}, "0"), ": acceptable but no progress (0)"),
    el("li", {}, el("kbd", {}, "3"), " or ", el("kbd", {}, "+"), ": right and useful (+1)"),
    el("li", {}, el("kbd", {}, "j"), "/", el("kbd", {}, "↓"), " next step, ", el("kbd", {}, "k"), "/", el("kbd", {}, "↑"), " previous"),
    el("li", {}, el("kbd", {}, "c"), " comment on the step, ", el("kbd", {}, "w"), " write the step as it should be (a correction), ",
      el("kbd", {}, "f"), " finish with a reason, ", el("kbd", {}, "n"), " next record"),
    el("li", {}, el("kbd", {}, "p"), " your previous record, to correct it (a changed rating opens it again)"),
    el("li", {}, el("kbd", {}, "g"), " the project's guidelines, ", el("kbd", {}, "?"), " these keys")),
    el("p", {}, "Every rating is saved when you give it; \"saved\" means it is on the server's disk."),
    el("button", { type: "button", onclick: () => d.close() }, "Close"));
  d.addEventListener("close", () => d.remove());
  document.body.append(d); d.showModal();
}

document.addEventListener("keydown", (e) => {
  if (document.querySelector("dialog[open]") || e.ctrlKey || e.metaKey || e.altKey) return;
  if (e.target instanceof HTMLInputElement || e.target instanceof HTMLTextAreaElement) return;
  if (e.key === "g" && state.me) { e.preventDefault(); showGuidelines(); return; }
  if (!state.me || !/^#\/(label|record\/)/.test(location.hash || "#/label")) return;
  // `p` works with no record open too (when the queue is done).
  if (!state.record && e.key !== "p") return;
  const map = { "1": -1, "-": -1, "2": 0, "0": 0, "3": 1, "+": 1, "=": 1 };
  let action = null;
  if (e.key in map) action = () => rate(map[e.key]);
  else if (e.key === "j" || e.key === "ArrowDown") action = () => focusStep(state.current + 1);
  else if (e.key === "k" || e.key === "ArrowUp") action = () => focusStep(state.current - 1);
  else if (e.key === "c") action = () => stepBox("comment");
  else if (e.key === "w") action = () => stepBox("correction");
  else if (e.key === "f") action = () => finishDialog(state.record.steps.some((s) => s.rating === -1) ? "found_error" : "solution");
  else if (e.key === "n" && state.record.finish_reason) action = nextRecord;
  else if (e.key === "p") action = previousRecord;
  else if (e.key === "?") action = help;
  if (!action) return;
  e.preventDefault();
  // Keys typed faster than the server answers act in order, each on the step the last one left
  // current (a rating moves on only once it is saved).
  state.keys = state.keys.then(() => {
    if ((!state.record && action !== previousRecord) || document.querySelector("dialog[open]")) return;
    return action();
  }).catch((x) => status(x.message, true));
});

function pct(x) { return x === null ? "—" : (100 * x[0]).toFixed(1) + "% of " + x[1]; }
function num(x, d) { return x === null || x === undefined ? "—" : Number(x).toFixed(d); }

async function showDashboard() {
  state.record = null;
  const d = await api("GET", projectApi("dashboard"));
  const rows = d.labellers.map((l) => el("tr", {}, el("td", {}, l.user), el("td", {}, l.finished), el("td", {}, l.steps),
    el("td", {}, num(l.steps_per_minute, 1)), el("td", {}, pct(l.gold_step_agreement)), el("td", {}, pct(l.gold_first_error_agreement)),
    el("td", {}, num(l.mean_cohen_kappa, 2))));
  const table = el("table", {}, el("thead", {}, el("tr", {}, ...["Labeller", "Records", "Steps", "Steps/min", "Gold steps agreed",
    "Gold first error agreed", "Mean Cohen's κ"].map((h) => el("th", { scope: "col" }, h)))), el("tbody", {}, ...rows));
  const review = el("ul", {}, ...d.to_review.map(([id, ext]) => el("li", {}, el("a", { href: "#/review/" + id }, ext))));
  const main = document.getElementById("main");
  main.replaceChildren(el("h1", {}, "Dashboard: " + d.project),
    el("p", { class: "meta" }, el("span", {}, d.records + " records (" + d.gold + " gold)"), el("span", {}, d.assigned + " given, " + d.finished + " finished"),
      el("span", {}, "Fleiss' κ " + (d.fleiss_kappa ? num(d.fleiss_kappa[0], 2) + " over " + d.fleiss_kappa[1] + " steps" : "—")),
      el("span", {}, "First error agreed: " + pct(d.first_error_agreement))),
    table, el("h2", {}, "To review (labellers disagree)"), d.to_review.length ? review : el("p", {}, "Nothing."));
  if (state.me.role === "admin") {
    const base = projectApi("export?to=");
    main.append(el("h2", {}, "Export"), el("p", {}, ...["stepwise", "prm800k", "trl", "math-shepherd", "processbench"].flatMap((f) =>
      [el("a", { href: base + f, download: state.project + "." + f + ".jsonl" }, f), " "])));
    main.append(guidelinesEditor());
  }
  main.focus();
}

// Admins edit the guidelines here; labellers see the new text at their next page load.
function guidelinesEditor() {
  const t = el("textarea", { id: "guidelines-text", rows: "10", "aria-label": "Guidelines for labellers" });
  t.value = (state.guidelines && state.guidelines.text) || "";
  const save = async () => {
    try {
      const path = projectApi("guidelines");
      await api("PUT", path, { text: t.value });
      state.guidelines = await api("GET", path);
      nav(); status(t.value.trim() ? "Guidelines saved" : "Guidelines removed");
    } catch (x) { status("Guidelines not saved: " + x.message, true); }
  };
  return el("section", { class: "editor" }, el("h2", {}, el("label", { for: "guidelines-text" }, "Guidelines")),
    el("p", { class: "keys" }, "Plain text; $…$ is typeset. Shown to each labeller before their first record and after each change."),
    t, el("button", { type: "button", onclick: save }, "Save guidelines"));
}

async function showReview(id) {
  state.record = null;
  const r = await api("GET", "/api/records/" + id + "/review");
  const list = el("ol", { class: "steps" });
  r.steps.forEach((text, i) => {
    const votes = el("div", { class: "side" }, ...r.labellings.map((l) => {
      const x = l.ratings[i], w = l.corrections[i];
      return el("span", {}, l.user + ": " + (x && x[0] !== null ? x[0] : "—") + (x && x[1] ? " (" + x[1] + ")" : ""),
        w ? el("span", { class: "note" }, " wrote: ", rich(w, false)) : null);
    }));
    const adj = el("div", { class: "rate", role: "group", "aria-label": "Adjudicate step " + (i + 1) });
    for (const v of [-1, 0, 1]) {
      adj.append(el("button", { type: "button", class: "r" + v, "aria-pressed": String(r.adjudicated[i] === v), onclick: async () => {
        try { await api("PUT", "/api/records/" + id + "/steps/" + i + "/adjudication", { rating: v }); status("Adjudicated step " + (i + 1)); showReview(id); }
        catch (x) { status("Not saved: " + x.message, true); }
      } }, v > 0 ? "+1" : v === 0 ? "0" : "−1"));
    }
    list.append(el("li", { class: "step" }, el("span", { class: "n" }, String(i + 1)), rich(text, false), adj, votes));
  });
  document.getElementById("main").replaceChildren(el("h1", {}, "Review"), el("section", { class: "card" }, rich(r.question, false)), list);
}

window.addEventListener("hashchange", () => { if (state.me) route(); });
window.addEventListener("DOMContentLoaded", () => {
  api("GET", "/api/me").then(start, () => showLogin());
});
