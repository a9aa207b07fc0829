"""Decoding a TranslationTransformer: beam search with the decoder cache, and BLEU.

    step = beam_step(model, beam)                      # compiled once per model and beam size
    ids = beam_search(model, source_ids, beam, step_fn=step)
    hyps = translate(model, examples, beam, lenpen, max_tokens)   # any number of sentences, in order; progress
                                                                  # on standard output (`DecodingProgress`)
    bleu_scores(hyps, references(pairs, corpus), corpus, "en")    # detokenized sacrebleu and tokenized BLEU

Used by harness/nmt_job.py (validation and test BLEU) and harness/translate.py (--translate: raw text);
the decoding flags' defaults are `constants.DECODING` and their checks `specs.check_decoding`. Beam search
follows fairseq's `sequence_generator.py`: hypotheses end with EOS, scores are sum(log p) / length^lenpen,
and the defaults are fairseq-generate's: at most max_len_a * S + max_len_b = 200 tokens before EOS
(--max-len-a 0 --max-len-b 200), at least min_len = 1 (--min-len 1: EOS is not the first token), <unk>
allowed with no penalty (--unkpen 0).
"""

import numpy as np
import sacrebleu
from keras import ops
from sacremoses import MosesDetokenizer, MosesTokenizer

from harness.backend import compiled
from harness.constants import BPE_MARKER, DECODING_BUCKETS, EOS, MAX_LEN, PAD, UNK
from harness.progress import DecodingProgress


def beam_step(model, beam, unkpen=0.0):
    """The compiled per-token work of `beam_search` for `beam`: reorder the caches to the surviving
    hypotheses, run one cached decoder step, and keep the best 2 x beam continuations of each
    sentence. Only those (and log p(EOS)) go back to the host, not the beam x vocabulary scores.
    PAD is never generated; <unk> costs `unkpen` (fairseq's --unkpen: log p(<unk>) - unkpen; 0 by
    default, inf bans it).

        step(last (B*K, 1), index, source_mask, cache, cross, scores (B*K,), origin (B*K,))
          -> (top scores (B, 2K), top flat indices k * vocab + token (B, 2K), log p(EOS) (B*K,), cache)
    """
    penalty = np.zeros(model.vocab_size, "float32")
    penalty[PAD], penalty[UNK] = np.inf, unkpen

    def step(last, index, source_mask, cache, cross, scores, origin):
        cache = [ops.take(layer, origin, axis=1) for layer in cache]  # (2, B*K, H, L, dk) each
        logits, cache = model.decode_step(last, index, source_mask, cache, cross)
        logp = ops.log_softmax(ops.cast(logits, "float32"), axis=-1) - penalty
        candidates = ops.reshape(ops.expand_dims(scores, 1) + logp, (-1, beam * model.vocab_size))
        top_scores, top_index = ops.top_k(candidates, 2 * beam)
        return top_scores, top_index, logp[:, EOS], cache

    return BeamStep(compiled(model, step), compiled(model, _encode_for_decoding(model)))


class BeamStep:
    """`beam_step`'s compiled functions: called, the per-token step; `encode`, the encoder pass and the
    cross-attention keys and values of a batch, compiled too, so that each batch shape is one program
    instead of one program per operation of the encoder for each shape."""

    def __init__(self, step, encode):
        self.step, self.encode = step, encode

    def __call__(self, *args):
        return self.step(*args)


def _encode_for_decoding(model):
    def encode(rows):  # (B*K, S) -> (source mask (B*K, 1, S), cross-attention cache)
        encoder_output, source_mask = model.encode(rows, training=False)
        return source_mask, model.cross_attention_cache(encoder_output)

    return encode


def beam_search(model, source_ids, beam=5, lenpen=1.2, max_len_a=0.0, max_len_b=200, min_len=1, step_fn=None):
    """Beam search with the decoder cache (fairseq style), greedy when beam = 1.

    A hypothesis ending in EOS is finished only when it is among the best `beam` candidates of its
    step, with score  sum(log p) / length^lenpen  (length counts the EOS). Returns token-id lists
    (without the EOS). Lengths as fairseq-generate's: a sentence of S source tokens (with its EOS) gets
    at most  max_len = min(max_len_a * S + max_len_b, MAX_LEN)  tokens before the EOS, which is forced
    then, and at least `min_len` (EOS is not a candidate before). fairseq takes S of the padded batch;
    here each sentence has its own, so that its translation does not depend on what it is batched with.
    `step_fn`: `beam_step(model, beam, unkpen)`, made once and passed in to compile only once.
    """
    step_fn = step_fn or beam_step(model, beam)
    source_ids = np.asarray(source_ids)
    batch, source_length = source_ids.shape
    # The cache from the padded length, so that every batch of a bucket has one shape (one compilation);
    # each sentence ends by its own limit, whatever it is batched with.
    max_len = int(min(MAX_LEN, max_len_a * source_length + max_len_b))
    limits = np.minimum(max_len, (max_len_a * (source_ids != PAD).sum(axis=1) + max_len_b).astype(int))
    if min_len > limits.min():
        raise ValueError(f"min_len {min_len} is above the length limit {limits.min()} of a sentence")
    rows = np.repeat(source_ids, beam, axis=0)  # (B * K, S)
    source_mask, cross = step_fn.encode(rows.astype("int32"))
    cache = model.init_cache(batch * beam, max_len + 1)  # decoder inputs: EOS and up to max_len tokens
    scores = np.full((batch, beam), -np.inf)
    scores[:, 0] = 0.0
    tokens = np.full((batch, beam, 0), PAD, "int64")
    finished = [[] for _ in range(batch)]  # (score, tokens)
    last = np.full((batch * beam, 1), EOS, "int32")
    origin = np.arange(batch * beam)  # the hypothesis each row continues
    for step in range(max_len + 1):
        # numpy arrays go to the compiled step as they are: on jax, converting one to a tensor outside a
        # compiled function compiles a program of its own for each shape.
        top_scores, top, eos_logp, cache = step_fn(
            last, np.int32(step), source_mask, cache, cross, scores.reshape(-1).astype("float32"),
            origin.astype("int32"))
        top_scores = np.asarray(ops.convert_to_numpy(top_scores), "float64")  # (B, 2K), best first
        top = np.asarray(ops.convert_to_numpy(top), "int64")
        forced = np.flatnonzero(limits == step)
        if forced.size:  # a sentence at its limit: EOS is the only continuation
            _force_eos(top_scores, top, scores, eos_logp, forced, model.vocab_size)
        new_scores, parent, new_last = _next_beam(top_scores, top, tokens, finished, step, lenpen, min_len,
                                                  model.vocab_size)
        if all(len(f) >= beam or not np.isfinite(new_scores[b]).any() for b, f in enumerate(finished)):
            break
        origin = (np.arange(batch)[:, None] * beam + parent).reshape(-1)
        tokens = np.concatenate([tokens[np.arange(batch)[:, None], parent], new_last[:, :, None]], axis=2)
        scores = new_scores
        last = new_last.reshape(-1, 1).astype("int32")
    return [max(f)[1] if f else [] for f in finished]


def _force_eos(top_scores, top, scores, eos_logp, forced, vocab_size):
    """Make EOS the only continuation of the sentences `forced` (at their length limit), in place: their
    candidates `top_scores` and `top` (B, 2K) become each hypothesis's score (`scores`, B x K) plus its log
    p(EOS) (`eos_logp`, B*K), best first, and -inf after the K of them."""
    batch, beam = scores.shape
    ends = (scores + np.asarray(ops.convert_to_numpy(eos_logp), "float64").reshape(batch, beam))[forced]
    order = np.argsort(-ends, axis=1, kind="stable")
    top_scores[forced], top[forced] = -np.inf, 0
    top_scores[forced, :beam] = np.take_along_axis(ends, order, 1)
    top[forced, :beam] = order * vocab_size + EOS


def _next_beam(top_scores, top, tokens, finished, step, lenpen, min_len, vocab_size):
    """(scores, hypothesis continued, token), each (B, K), of the next step's live hypotheses: the best K
    candidates of each sentence (`top_scores` and `top`, k * vocab + token, best first) that do not end in
    EOS. A candidate ending in EOS among the best K, from step `min_len` on, goes into the sentence's
    `finished` list instead (score / (step + 1)^lenpen, and the tokens of `tokens` (B, K, step) it ends); a
    sentence with K finished hypotheses keeps none live (scores -inf)."""
    batch, beam, _ = tokens.shape
    new_scores = np.full((batch, beam), -np.inf)
    parent = np.zeros((batch, beam), "int64")
    new_last = np.full((batch, beam), EOS, "int64")
    for b in range(batch):
        live = 0
        for rank, (score, flat) in enumerate(zip(top_scores[b], top[b])):
            if not np.isfinite(score) or len(finished[b]) >= beam:
                break
            k, token = divmod(int(flat), vocab_size)
            if token == EOS:
                if rank < beam and step >= min_len:  # EOS counts only among the top `beam` candidates
                    finished[b].append((score / (step + 1) ** lenpen, tokens[b, k].tolist()))
                continue
            if live < beam:
                new_scores[b, live], parent[b, live], new_last[b, live] = score, k, token
                live += 1
        if len(finished[b]) >= beam:
            new_scores[b] = -np.inf
    return new_scores, parent, new_last


def translate(model, examples, beam, lenpen, max_tokens, step_fn=None, unkpen=0.0, progress="decoding",
              progress_every=30.0, **lengths):
    """Decode the source side of encoded examples, in input order. `lengths`: max_len_a, max_len_b and
    min_len of `beam_search`; `unkpen` as `beam_step`'s (used only when no `step_fn` is given).
    `progress`: the label of `DecodingProgress`'s lines (a line every `progress_every` seconds and a
    final one), or None for none."""
    order = sorted(range(len(examples)), key=lambda i: len(examples[i][0]))
    results = [None] * len(examples)
    rows = max(1, min(128, max_tokens // (16 * beam)))
    step_fn = step_fn or beam_step(model, beam, unkpen)
    shown = DecodingProgress(len(examples), progress, progress_every) if progress and examples else None
    for start in range(0, len(order), rows):
        chunk = order[start:start + rows]
        length = next(b for b in DECODING_BUCKETS if b >= max(len(examples[i][0]) for i in chunk))
        source = np.full((rows, length), PAD, "int32")
        source[:, 0] = EOS  # filler rows
        for r, i in enumerate(chunk):
            source[r, :len(examples[i][0])] = examples[i][0]
        for i, ids in zip(chunk, beam_search(model, source, beam, lenpen, step_fn=step_fn, **lengths)):
            results[i] = ids
        if shown:
            shown.update(start + len(chunk))
    return results


def bleu_scores(hypotheses, references, corpus, tgt):
    """Detokenized sacrebleu BLEU (with signature) and tokenized, lowercased BLEU (the paper's)."""
    if corpus.bpe_split:  # already Moses-tokenized text: detokenize for sacrebleu
        detok = MosesDetokenizer(lang=tgt)
        tokenized_hyp, tokenized_ref = hypotheses, references
        hyp = [detok.detokenize(h.split()) for h in hypotheses]
        ref = [detok.detokenize(r.split()) for r in references]
    else:
        tok = MosesTokenizer(lang=tgt)
        hyp, ref = hypotheses, references
        tokenized_hyp = [tok.tokenize(h, return_str=True, escape=False) for h in hypotheses]
        tokenized_ref = [tok.tokenize(r, return_str=True, escape=False) for r in references]
    metric = sacrebleu.BLEU(force=True)  # our hypotheses are detokenized text; a final " ." is the model's
    detok_bleu = metric.corpus_score(hyp, [ref])
    tokenized = sacrebleu.BLEU(tokenize="none", lowercase=True, force=True).corpus_score(tokenized_hyp, [tokenized_ref])
    return dict(bleu=round(detok_bleu.score, 2), signature=str(metric.get_signature()),
                tokenized_bleu=round(tokenized.score, 2))


def references(pairs, corpus):
    return [(t + " ").replace(BPE_MARKER, "").strip() if corpus.bpe_split else t for _, t in pairs]
