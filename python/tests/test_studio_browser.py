"""The labelling studio in a real browser (Chromium, headless, driven by Playwright): a whole
session by keyboard, hostile model-written steps shown as text, nothing loaded from elsewhere,
ratings that survive a reload, the dashboard and an export. Needs `stepwise` on PATH and Debian's
chromium (``.ci/run`` installs it; set STEPWISE_REQUIRE_BROWSER=1 to fail rather than skip
without it). STEPWISE_SCREENSHOTS=DIR saves the pages the docs show."""

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import studio_call as call

CHROMIUM = os.environ.get("STEPWISE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
if not CHROMIUM or not shutil.which("stepwise"):
    if os.environ.get("STEPWISE_REQUIRE_BROWSER"):
        raise RuntimeError("the studio's browser test needs chromium and stepwise on PATH")
    pytest.skip("no chromium (apt-get install chromium) or no stepwise on PATH", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api")

HOSTILE = [
    "Let $x = 2$, so $x^2 = 4$.",
    "<script>window.__pwned = 1</script>",
    '<img src=x onerror="window.__pwned = 2">',
    r"See $\href{javascript:window.__pwned=3}{here}$, $\url{http://198.51.100.7/x}$ "
    r"and $\includegraphics{http://198.51.100.7/a.png}$.",
    "So the answer is $4$.",
]

CORRECTION = r"Their sum is $2 + 3 = 5$. <b>not bold</b>"

RECORDS = [
    {"id": "hostile", "question": "What is $x^2$ when <b>x</b> = 2? (Tickets cost $1000 / $20 a head.)", "gold_answer": "4", "final_answer": "4",
     "steps": [{"text": t} for t in HOSTILE], "scores": {"prm": [0.9, 0.5, 0.7, 0.8, 0.95]}},
    {"id": "quadratic", "question": r"Find the sum of the roots of $x^2 - 5x + 6 = 0$.", "gold_answer": "5",
     "final_answer": "6",
     "steps": [{"text": r"The roots of $x^2 - 5x + 6 = 0$ satisfy $(x-2)(x-3) = 0$."},
               {"text": r"So the roots are $x = 2$ and $x = 3$."},
               {"text": r"Their sum is $2 \cdot 3 = 6$."},
               {"text": r"The answer is $\boxed{6}$."}],
     "scores": {"prm": [0.93, 0.88, 0.41, 0.37]}},
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def studio(tmp_path):
    records = tmp_path / "records.jsonl"
    records.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    db = tmp_path / "labels.sqlite"
    for name, role in [("alice", "labeller"), ("bob", "labeller"), ("root", "admin")]:
        subprocess.run(["stepwise", "studio", "user", "add", name, "--role", role, "--db", str(db)],
                       input=f"{name}-password\n", text=True, check=True, capture_output=True)
    port = free_port()
    proc = subprocess.Popen(["stepwise", "studio", "--db", str(db), "--input", str(records), "--policy",
                             "uncertainty", "--qc-every", "0", "--overlap", "2", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            urllib.request.urlopen(base + "/", timeout=1)
            break
        except OSError:
            time.sleep(0.05)
    yield base
    proc.terminate()
    proc.wait(10)


def label_by_script(base, name, ratings):
    """A second labeller, through the documented HTTP API: `ratings` by record id."""
    token = call(base, "POST", "/api/login", body={"name": name, "password": f"{name}-password"})["token"]
    while (record := call(base, "POST", "/api/projects/default/next", token)["record"]) is not None:
        view = call(base, "GET", f"/api/records/{record}", token)
        mine = ratings[view["ext_id"]]
        for i, r in enumerate(mine):
            call(base, "PUT", f"/api/records/{record}/steps/{i}", token, {"rating": r})
        reason = "found_error" if -1 in mine else "solution"
        call(base, "POST", f"/api/records/{record}/finish", token, {"finish_reason": reason})


def shot(page, name):
    out = os.environ.get("STEPWISE_SCREENSHOTS")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(out) / name), full_page=True)


def sign_in(page, base, name):
    page.goto(base + "/")
    page.wait_for_selector("#name")
    page.keyboard.type(name)
    page.keyboard.press("Tab")
    page.keyboard.type(f"{name}-password")
    page.keyboard.press("Enter")


def test_a_whole_labelling_session_by_keyboard(studio):
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        requests = []
        page.on("request", lambda r: requests.append(r.url))
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))

        # A wrong password is refused without saying which part was wrong.
        page.goto(studio + "/")
        page.fill("#name", "alice")
        page.fill("#password", "not-the-password")
        page.keyboard.press("Enter")
        assert page.wait_for_selector("[role=alert]:not(:empty)").inner_text() == "wrong user name or password"

        sign_in(page, studio, "alice")
        page.wait_for_selector("#step-4")
        # The hostile record first (its 0.5 score is the least certain step).
        texts = [page.inner_text(f"#step-{i} .text") for i in range(5)]
        assert texts[1] == HOSTILE[1] and texts[2] == HOSTILE[2]
        assert page.evaluate("window.__pwned") is None
        assert page.locator("main script, main img, main a, main iframe").count() == 0
        assert page.locator("#step-0 .katex").count() == 2  # real LaTeX is typeset
        question = page.inner_text("section.card h1 + .text")
        assert "<b>" in question  # the question's markup is text
        assert "$1000 / $20" in question  # dollars in prose are not math
        # The macros that would link or load a URL are refused by KaTeX (`trust: false`): their
        # names show in red, nothing is linked or fetched.
        shown = page.inner_text("#step-3 .text")
        assert "\\href" in shown and "\\url" in shown and "\\includegraphics" in shown, shown
        # ... on one line, not one letter a line (the page's text styles once reached into KaTeX).
        height = page.evaluate("document.querySelector('#step-3 div.text').getBoundingClientRect().height")
        assert height < 60, height

        # Rate by keyboard: +1, −1 (the step is wrong), then reload: the ratings are back.
        page.keyboard.press("3")
        page.wait_for_selector("#save-0.saved")
        page.keyboard.press("1")
        page.wait_for_selector("#save-1.saved")
        page.keyboard.press("k")  # back to step 2, and re-rate it 0
        page.keyboard.press("2")
        page.wait_for_selector("#save-1.saved")
        page.reload()
        page.wait_for_selector("#step-4")
        assert page.get_attribute("#step-0 button.r1", "aria-pressed") == "true"
        assert page.get_attribute("#step-1 button.r0", "aria-pressed") == "true"
        assert page.evaluate("document.activeElement.id") == "step-2"
        for key in ["1", "3", "3"]:
            page.keyboard.press(key)
        page.wait_for_selector("dialog#finish")
        page.keyboard.press("Enter")  # found_error, as suggested

        # The next record (four steps: wait until the five-step one is gone): LaTeX, the PRM's
        # suggestions, the wrong final answer.
        page.wait_for_selector("#step-4", state="detached")
        page.wait_for_selector("#step-3")
        assert page.inner_text("#grade") == "(wrong)"
        assert page.locator("meter").count() == 4
        page.keyboard.press("3")
        page.wait_for_selector("#save-0.saved")
        page.keyboard.press("3")
        page.wait_for_selector("#save-1.saved")
        page.keyboard.press("c")
        page.keyboard.type("2 · 3 is the product, not the sum")
        page.keyboard.press("Enter")
        page.wait_for_selector("#step-2 .note")
        page.keyboard.press("1")
        page.wait_for_selector("#save-2.saved")
        # Back to the wrong step to write it right: the box starts from the model's step, and
        # what is written shows as text with its math typeset.
        page.keyboard.press("k")
        page.keyboard.press("w")
        box = "#step-2 textarea.correction"
        page.wait_for_selector(box)
        assert page.input_value(box) == RECORDS[1]["steps"][2]["text"]
        page.keyboard.press("Control+A")
        page.keyboard.type(CORRECTION)
        page.keyboard.press("Enter")
        page.wait_for_selector("#step-2 div.correction .katex")
        assert "<b>not bold</b>" in page.inner_text("#step-2 div.correction")
        assert page.locator("main b").count() == 0
        shot(page, "studio-label.png")
        page.keyboard.press("j")
        page.keyboard.press("1")
        page.wait_for_selector("dialog#finish")
        page.keyboard.press("1")  # found_error
        page.wait_for_selector("text=All done")
        page.keyboard.press("3")  # nothing to rate on this page: no error

        # `p` opens the record just finished to correct it: a changed rating opens it again
        # until it is finished once more (here changed and changed back, so the labels stand).
        page.keyboard.press("p")
        page.wait_for_selector("#finished >> text=Finished: found_error")
        page.keyboard.press("2")
        page.wait_for_selector("#finished >> text=Open again")
        page.keyboard.press("k")
        page.keyboard.press("3")
        page.wait_for_selector("#save-0.saved")
        page.keyboard.press("f")
        page.wait_for_selector("dialog#finish")
        page.keyboard.press("1")
        page.wait_for_selector("text=All done")
        assert page.evaluate("location.hash") == "#/label"
        page.goto(studio + "/#/mine")
        assert page.wait_for_selector("table tbody tr:nth-child(2)").inner_text().startswith("hostile\t5\tfound_error")
        assert page.inner_text("table tbody tr").startswith("quadratic\t4\tfound_error")

        # Only the server was asked for anything.
        assert requests and all(u.startswith(studio + "/") for u in requests), requests
        assert errors == []

        # A second labeller on the same records, by script; they disagree with Alice on one step.
        label_by_script(studio, "bob", {"hostile": [1, 1, -1, 1, 1], "quadratic": [1, 1, -1, -1]})

        # The admin's dashboard and export.
        admin = browser.new_page(viewport={"width": 1100, "height": 700})
        sign_in(admin, studio, "root")
        admin.wait_for_selector("#nav >> text=Dashboard")
        admin.goto(studio + "/#/dashboard")
        admin.wait_for_selector("table tbody tr")
        row = admin.inner_text("table tbody tr")
        assert row.startswith("alice\t2\t9"), row
        shot(admin, "studio-dashboard.png")
        lines = admin.evaluate(
            "fetch('/api/projects/default/export?to=prm800k').then(r => r.text())").strip().split("\n")
        exported = [json.loads(l) for l in lines]
        assert sorted(e["labeler"] for e in exported) == ["alice", "alice", "bob", "bob"]
        assert "Fleiss' κ 0.7" in admin.inner_text("main")  # 9 steps, one disagreement
        assert admin.locator("a[href^='#/review/']").count() == 1
        hostile = next(e for e in exported if e["question"]["problem"].startswith("What is") and e["labeler"] == "alice")
        assert [s["completions"][0]["rating"] for s in hostile["label"]["steps"]] == [1, 0, -1, 1, 1]
        assert hostile["label"]["finish_reason"] == "found_error"
        quadratic = next(e for e in exported if e["question"]["problem"].startswith("Find") and e["labeler"] == "alice")
        assert quadratic["label"]["steps"][2]["human_completion"]["text"] == CORRECTION
        browser.close()


GUIDELINES = ("Rate each step as PRM800K's labellers did.\n\n"
              "A step is −1 when it is wrong: $2 + 2 = 5$ is −1.\n"
              '<img src=x onerror="window.__pwned = 4"> is text, not a picture.')


def test_guidelines_are_read_first_and_edited_by_the_admin(studio):
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        errors = []
        # The admin writes the guidelines on the dashboard, by keyboard.
        admin = browser.new_page(viewport={"width": 1100, "height": 800})
        admin.on("pageerror", lambda e: errors.append(str(e)))
        sign_in(admin, studio, "root")
        admin.wait_for_selector("#nav >> text=Dashboard")
        admin.goto(studio + "/#/dashboard")
        admin.wait_for_selector("#guidelines-text")
        admin.focus("#guidelines-text")
        admin.keyboard.insert_text(GUIDELINES)
        admin.keyboard.press("Tab")
        admin.keyboard.press("Enter")
        admin.wait_for_selector("#status >> text=Guidelines saved")

        # A labeller's first visit opens them before the first record; keys do not rate meanwhile.
        page = browser.new_page(viewport={"width": 1100, "height": 800})
        page.on("pageerror", lambda e: errors.append(str(e)))
        sign_in(page, studio, "alice")
        dialog = page.wait_for_selector("dialog.guidelines[open]")
        shown = dialog.inner_text()
        assert "A step is −1 when it is wrong" in shown and '<img src=x onerror="window.__pwned = 4">' in shown
        assert page.locator("dialog.guidelines .katex").count() == 1
        assert page.locator("dialog.guidelines img").count() == 0
        assert page.evaluate("window.__pwned") is None
        shot(page, "studio-guidelines.png")
        page.keyboard.press("3")
        page.keyboard.press("Escape")
        page.wait_for_selector("dialog.guidelines", state="detached")
        page.wait_for_selector("#step-0")
        assert page.get_attribute("#step-0 button.r1", "aria-pressed") != "true"
        # `g` opens them again, from the nav button too; a reload does not, once read.
        page.keyboard.press("g")
        page.wait_for_selector("dialog.guidelines[open]")
        page.keyboard.press("Escape")
        page.wait_for_selector("dialog.guidelines", state="detached")
        page.click("#nav >> text=Guidelines")
        page.wait_for_selector("dialog.guidelines[open]")
        page.keyboard.press("Escape")
        page.reload()
        page.wait_for_selector("#step-0")
        page.wait_for_timeout(300)
        assert page.locator("dialog.guidelines").count() == 0

        # A change is shown again at the next visit.
        admin.reload()
        admin.wait_for_selector("dialog.guidelines[open]")  # the admin has not read them either
        admin.keyboard.press("Escape")
        admin.wait_for_selector("#guidelines-text")
        admin.fill("#guidelines-text", GUIDELINES + "\nA step that repeats the last one is 0.")
        admin.click("text=Save guidelines")
        admin.wait_for_selector("#status >> text=Guidelines saved")
        page.reload()
        assert "repeats the last one" in page.wait_for_selector("dialog.guidelines[open]").inner_text()
        assert errors == []
        browser.close()
