"""The official `openai` Python package against `stepwise serve`, as a user would use it.

    python openai_client.py BASE_URL API_KEY MODEL

Run by `tests/remote.rs` when STEPWISE_OPENAI_PYTHON names a Python with `openai` installed
(`.ci/run` makes one). Exits non-zero with the failed check's message.
"""
import sys

import openai
from openai import OpenAI

base_url, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
client = OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0)
checks = []


def check(name, ok, detail=""):
    if not ok:
        sys.exit(f"FAILED {name}: {detail}")
    checks.append(name)


ids = [m.id for m in client.models.list().data]
check("models.list names the policy", model in ids, ids)

kw = dict(model=model, prompt="What is 2 + 3?\n", max_tokens=8, temperature=0.8)
a = client.completions.create(n=2, seed=7, logprobs=1, **kw)
check("completions: n choices", len(a.choices) == 2, a)
check(
    "completions: logprobs per token",
    all(len(c.logprobs.tokens) == len(c.logprobs.token_logprobs) > 0 for c in a.choices),
    a.choices[0].logprobs,
)
check("completions: usage", a.usage.completion_tokens > 0 and a.usage.prompt_tokens > 0, a.usage)
b = client.completions.create(n=2, seed=7, logprobs=1, **kw)
check("completions: a seed reproduces", [c.text for c in a.choices] == [c.text for c in b.choices])
c = client.completions.create(n=1, seed=8, stop=["l"], **kw)
check(
    "completions: stop strings cut the text",
    "l" not in c.choices[0].text and c.choices[0].finish_reason in ("stop", "length"),
    c.choices[0],
)
for stop in (None, ["u"]):
    streamed = "".join(
        chunk.choices[0].text for chunk in client.completions.create(n=1, seed=9, stream=True, stop=stop, **kw)
    )
    whole = client.completions.create(n=1, seed=9, stop=stop, **kw).choices[0].text
    check("completions: streaming gives the same text", streamed == whole, (stop, streamed, whole))
# Two choices streamed as they are decoded, their chunks interleaved: each put together is its whole.
texts = ["", ""]
for chunk in client.completions.create(n=2, seed=9, stream=True, **{**kw, "max_tokens": 40}):
    for c in chunk.choices:
        texts[c.index] += c.text
whole = [c.text for c in client.completions.create(n=2, seed=9, **{**kw, "max_tokens": 40}).choices]
check("completions: n streamed choices each give their text", texts == whole, (texts, whole))
# Log-probabilities streamed with their chunks: put together, the unstreamed reply's.
got = [[], []]
for chunk in client.completions.create(n=2, seed=9, stream=True, logprobs=2, **{**kw, "max_tokens": 40}):
    for c in chunk.choices:
        if c.logprobs is not None:
            got[c.index] += list(zip(c.logprobs.tokens, c.logprobs.token_logprobs, c.logprobs.text_offset))
want = [
    list(zip(c.logprobs.tokens, c.logprobs.token_logprobs, c.logprobs.text_offset))
    for c in client.completions.create(n=2, seed=9, logprobs=2, **{**kw, "max_tokens": 40}).choices
]
check("completions: streamed logprobs put together are the reply's", got == want and len(want[0]) == 40, (got, want))

# lm-evaluation-harness's loglikelihood request: the prompt's own log-probabilities, echoed.
for max_tokens in (0, 1):
    e = client.completions.create(model=model, prompt="What is 2 + 3?\n5", echo=True, logprobs=1, max_tokens=max_tokens)
    lp = e.choices[0].logprobs
    check(
        f"completions: echo with logprobs gives the prompt's (max_tokens={max_tokens})",
        lp.token_logprobs[0] is None
        and len(lp.token_logprobs) == e.usage.prompt_tokens + max_tokens
        and all(x <= 0 for x in lp.token_logprobs[1:])
        and e.choices[0].text.startswith("What is 2 + 3?\n5")
        and "".join(lp.tokens[: e.usage.prompt_tokens]) == "What is 2 + 3?\n5"
        and lp.text_offset[: e.usage.prompt_tokens]
        == [sum(len(t) for t in lp.tokens[:i]) for i in range(e.usage.prompt_tokens)],
        e,
    )
batch = client.completions.create(model=model, prompt=["What is 2 + 3?\n", "What is 4 * 2?\n"], n=2, max_tokens=4, seed=5)
check(
    "completions: a list of prompts gets n choices each, in order",
    [c.index for c in batch.choices] == [0, 1, 2, 3]
    and [c.text for c in batch.choices[2:]]
    == [c.text for c in client.completions.create(model=model, prompt="What is 4 * 2?\n", n=2, max_tokens=4, seed=5).choices],
    batch,
)
# A list of prompts streamed with echo and logprobs: each choice's chunks put together (the
# prompt's text and log-probabilities first) are the unstreamed reply's choice.
ask = dict(model=model, prompt=["What is 2 + 3?\n", "What is 4 * 2?\n"], n=2, max_tokens=12, seed=5, echo=True, logprobs=1)
got = [["", []] for _ in range(4)]
for chunk in client.completions.create(stream=True, **ask):
    for c in chunk.choices:
        got[c.index][0] += c.text
        if c.logprobs is not None:
            got[c.index][1] += list(zip(c.logprobs.tokens, c.logprobs.token_logprobs, c.logprobs.text_offset))
want = [
    [c.text, list(zip(c.logprobs.tokens, c.logprobs.token_logprobs, c.logprobs.text_offset))]
    for c in client.completions.create(**ask).choices
]
check(
    "completions: a list of prompts streamed with echo and logprobs is the reply",
    got == want and want[3][0].startswith("What is 4 * 2?\n") and want[3][1][0][1] is None,
    (got, want),
)
try:
    client.completions.create(model=model, prompt="x", max_tokens=0)
    check("errors: max_tokens 0 without echo", False, "accepted")
except openai.BadRequestError as e:
    check("errors: max_tokens 0 without echo is a 400 naming it", "max_tokens" in str(e), e)

messages = [{"role": "user", "content": "What is 2 + 3?"}]
chat = client.chat.completions.create(model=model, messages=messages, max_tokens=8, seed=3, logprobs=True, top_logprobs=2)
msg = chat.choices[0].message
check("chat: an assistant message", msg.role == "assistant" and isinstance(msg.content, str), chat)
check("chat: logprobs with alternatives", len(chat.choices[0].logprobs.content[0].top_logprobs) == 2)
streamed = [
    (t.token, t.logprob, [x.token for x in t.top_logprobs])
    for ch in client.chat.completions.create(
        model=model, messages=messages, max_tokens=8, seed=3, logprobs=True, top_logprobs=2, stream=True
    )
    if ch.choices and ch.choices[0].logprobs is not None
    for t in ch.choices[0].logprobs.content
]
want = [(t.token, t.logprob, [x.token for x in t.top_logprobs]) for t in chat.choices[0].logprobs.content]
check("chat: streamed logprobs put together are the reply's", streamed == want, (streamed, want))
stream = client.chat.completions.create(model=model, messages=messages, max_tokens=8, seed=3, stream=True)
text = "".join(ch.choices[0].delta.content or "" for ch in stream)
check("chat: streaming gives the same text", text == msg.content, (text, msg.content))
chunks = list(
    client.chat.completions.create(
        model=model, messages=messages, max_tokens=8, seed=3, stream=True, stream_options={"include_usage": True}
    )
)
usage = chunks[-1].usage
check(
    "chat: include_usage ends the stream with the usage",
    usage is not None and not chunks[-1].choices and usage.completion_tokens >= 1,
    chunks[-1],
)
try:
    client.chat.completions.create(
        model=model, messages=messages, max_tokens=8, response_format={"type": "json_object"}
    )
    check("errors: response_format", False, "accepted")
except openai.BadRequestError as e:
    check("errors: an unsupported response_format is a 400 naming it", "response_format" in str(e), e)

try:
    client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
    check("errors: unknown model", False, "accepted")
except openai.NotFoundError as e:
    check("errors: unknown model is 404", "no-such-model" in str(e), e)
try:
    client.completions.create(model=model, prompt="2 + 2 " * 400, max_tokens=8)
    check("errors: over-long prompt", False, "accepted")
except openai.BadRequestError as e:
    check("errors: over-long prompt is 400", "maximum context length" in str(e), e)
try:
    OpenAI(base_url=f"{base_url}/v1", api_key="wrong", max_retries=0).models.list()
    check("errors: wrong key", False, "accepted")
except openai.AuthenticationError:
    check("errors: wrong key is 401", True)

print(f"openai {openai.__version__}: {len(checks)} checks passed")
