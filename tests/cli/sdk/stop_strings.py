"""Issue 14, stop strings: a sequence sampled with `SamplingParams.stop` strings ends with the
token after which its decoded text first contains one of them, stop_reason "stop"; its tokens and
log-probs are those of the same seeded sample without stop strings, cut right after that token.
`get_info` names the tokenizer (the base model's directory, written by `rlforge init-model`); the
check decodes with its own byte-level decoder of that tokenizer.json, so the cut is computed
independently of the server. On the base model, on a LoRA sampler from
save_weights_and_get_sampling_client, and on a persisted sampler checkpoint."""

import json
import os

from sdk_check import adam, check, max_abs_diff, prompt, result, shifted
from tinker import types

PROMPT = [1, 9, 18, 27]
MAX_TOKENS = 40
SAMPLES = 2
SEED = 4242
NEVER = "<never in this text>"
REPLACEMENT = "\ufffd"


def bytes_to_unicode():
    """GPT-2's byte -> character table of byte-level BPE vocabularies."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
          + list(range(ord("\xae"), ord("\xff") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def load_decoder(directory):
    """decode(ids) for the byte-level tokenizer.json in `directory`, special tokens included."""
    with open(os.path.join(directory, "tokenizer.json"), encoding="utf-8") as f:
        doc = json.load(f)
    spelling = {i: s for s, i in doc["model"]["vocab"].items()}
    added = {t["id"]: t["content"] for t in doc.get("added_tokens", [])}
    byte_of = {c: b for b, c in bytes_to_unicode().items()}

    def decode(ids):
        out = bytearray()
        for i in ids:
            if i in added:
                out += added[i].encode("utf-8")
            else:
                out += bytes(byte_of[c] for c in spelling[i])
        return out.decode("utf-8", errors="replace")

    return decode


def cut_at(decode, tokens, stops):
    """Tokens kept: the least k whose prefix text holds a stop string (a prefix ending inside a
    character, in U+FFFD, is not seen yet); None when none does."""
    for k in range(1, len(tokens) + 1):
        text = decode(tokens[:k])
        if text.endswith(REPLACEMENT):
            continue
        if any(s in text for s in stops):
            return k
    return None


def spanning_stop(decode, tokens, start=3, length=3):
    """`length` printable ASCII characters the text completes at a token k >= start whose own new
    text is shorter, so that the string spans two tokens; None when there is none."""
    for k in range(max(start, 2), len(tokens) + 1):
        before, text = decode(tokens[:k - 1]), decode(tokens[:k])
        if before.endswith(REPLACEMENT) or text.endswith(REPLACEMENT):
            continue
        if not text.startswith(before) or not 0 < len(text) - len(before) < length:
            continue
        s = text[-length:]
        if len(text) >= length and all(" " <= ch <= "~" for ch in s):
            return s
    return None


def params(stop=None):
    return types.SamplingParams(max_tokens=MAX_TOKENS, seed=SEED, temperature=1.0, top_k=-1,
                                top_p=1.0, stop=stop)


def check_sampler(c, label, sampler, decode):
    free = result(sampler.sample(prompt(PROMPT), num_samples=SAMPLES, sampling_params=params()))
    first = list(free.sequences[0].tokens)
    stop = spanning_stop(decode, first)
    if not c.expect(stop is not None, "%s: no stop string spans two tokens of %r"
                    % (label, decode(first))):
        return
    c.note(label + "_stop_string", stop)
    for form, stops in (("list", [NEVER, stop]), ("string", stop)):
        out = result(sampler.sample(prompt(PROMPT), num_samples=SAMPLES,
                                    sampling_params=params(stops)))
        c.expect(len(out.sequences) == SAMPLES, "%s (%s): %d sequences, expected %d"
                 % (label, form, len(out.sequences), SAMPLES))
        for j, (want, got) in enumerate(zip(free.sequences, out.sequences)):
            tokens = list(want.tokens)
            k = cut_at(decode, tokens, [stop])
            keep = tokens[:k] if k else tokens
            reason = "stop" if k else want.stop_reason
            where = "%s (%s) sample %d, stop %r" % (label, form, j, stop)
            if j == 0:
                c.note(label + "_kept_of", [len(keep), len(tokens)])
                c.expect(k is not None and k < len(tokens),
                         "%s: the stop string does not end the sample early (cut %s of %d)"
                         % (where, k, len(tokens)))
            c.expect(list(got.tokens) == keep, "%s: tokens %s, expected %s (no-stop run %s)"
                     % (where, list(got.tokens), keep, tokens))
            c.expect(got.stop_reason == reason, "%s: stop_reason %r, expected %r"
                     % (where, got.stop_reason, reason))
            diff = max_abs_diff(list(got.logprobs), list(want.logprobs)[:len(keep)])
            c.expect(diff <= 1e-4, "%s: log-probs differ from the no-stop run by %g" % (where, diff))


def body(c):
    service = c.service()
    tc = c.lora(service, seed=71)
    info = tc.get_info()
    tokenizer_id = info.model_data.tokenizer_id
    c.note("tokenizer_id_basename", os.path.basename(os.path.normpath(tokenizer_id or "")))
    if not c.expect(tokenizer_id and os.path.isfile(os.path.join(tokenizer_id, "tokenizer.json")),
                    "get_info: model_data.tokenizer_id %r names no directory with a tokenizer.json"
                    % tokenizer_id):
        return
    decode = load_decoder(tokenizer_id)
    check_sampler(c, "base", service.create_sampling_client(base_model=c.args.base_model), decode)
    result(tc.forward_backward([shifted([1, 9, 18, 27, 36, 45], [0, 0, 1, 1, 1])], "cross_entropy"))
    result(tc.optim_step(adam(1e-2)))
    check_sampler(c, "lora", tc.save_weights_and_get_sampling_client(), decode)
    path = result(tc.save_weights_for_sampler("stop-strings")).path
    check_sampler(c, "checkpoint", service.create_sampling_client(model_path=path), decode)


check("stop_strings").run(body)
