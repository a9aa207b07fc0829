"""The two models of the paper: the translation Transformer (IWSLT14 / WMT14) and BERT's masked-LM encoder.

Both take `norm` in {"post", "pre", "deepnorm"}. Pre-LN adds a final LayerNorm after the last
encoder and decoder layer (Xiong et al., Table 1: x_final = LN(x_{L+1})); Post-LN and DeepNorm do not
need one, since every block already ends in a LayerNorm. DeepNorm's alpha and beta come from
`layers.deepnorm_constants(encoder_layers, decoder_layers, deepnorm_rule)`.
"""

import keras
import numpy as np
from keras import ops

from layers import (
    BERT_LAYER_NORM_EPSILON,
    LAYER_NORM_EPSILON,
    TOOLKIT_QKV_GAIN,
    BertEmbedding,
    LayerNorm,
    ScaledTokenEmbedding,
    TransformerDecoderBlock,
    TransformerEncoderBlock,
    activate,
    bert_normal,
    check_norm,
    deepnorm_constants,
    padding_mask,
    segment_mask,
)

_PACKAGE = "lnplace"


def _alpha_beta(norm, encoder_layers, decoder_layers, rule):
    """(encoder (alpha, beta), decoder (alpha, beta)); (1, 1) unless norm == "deepnorm"."""
    if check_norm(norm) != "deepnorm":
        return (1.0, 1.0), (1.0, 1.0)
    constants = deepnorm_constants(encoder_layers, decoder_layers, rule)
    return constants["encoder"] or (1.0, 1.0), constants["decoder"] or (1.0, 1.0)


def _final_norm(norm, epsilon, dtype, name):
    """Pre-LN's final LayerNorm (Table 1, last row); None for Post-LN and DeepNorm."""
    return LayerNorm(epsilon=epsilon, dtype=dtype, name=name) if norm == "pre" else None


def _check_positive_ints(**values):
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")


@keras.saving.register_keras_serializable(package=_PACKAGE)
class TranslationTransformer(keras.Model):
    """Encoder-decoder Transformer for translation (fairseq `transformer_iwslt_de_en` by default).

        encoder:  h_0 = drop(E[src] sqrt(d) + PE);  h_l = EncoderBlock_l(h_{l-1});  H = [LN](h_N)
        decoder:  g_0 = drop(E[tgt] sqrt(d) + PE);  g_l = DecoderBlock_l(g_{l-1}, H);  logits = [LN](g_M) E^T

    [LN] is Pre-LN's final LayerNorm. With one joint vocabulary (`source_vocab_size=None`) source,
    target and output embeddings share E (fairseq `--share-all-embeddings`); with separate source and
    target vocabularies the encoder has its own E_src (source_vocab_size x d) and the decoder's E is
    shared with the output (`--share-decoder-input-output-embed`, the IWSLT'14 recipe).
    Inputs: {"source_ids": (B, S), "decoder_input_ids": (B, T)} (target shifted right, starting with
    the BOS/EOS id); output: logits (B, T, vocab_size). Padding id `pad_id` is masked.
    Packed rows (several sentence pairs to a row, `harness/nmt_data.pack_batches`) add
    "source_segments", "decoder_segments" (each token's sentence number in its row, 0 at padding) and
    "source_positions", "decoder_positions" (its position in its own sentence): attention then stays
    within each sentence (`segment_mask`; cross-attention from target sentence k to source sentence k),
    so each pair's logits are those it would have alone.

    Initialisation: Xavier normal on every kernel, with gain `qkv_gain` on W^Q, W^K, W^V (fairseq's and
    torchscale's 1/sqrt(2) by default, `TOOLKIT_QKV_GAIN`; 1 is the setting the papers' analyses and
    DeepNet's pseudo-code assume), and DeepNorm's beta on W^V, W^O, W^1, W^2 on top. A checkpoint saved
    before `qkv_gain` existed loads as what it was: gain 1.

    Decoding: `encode` once, `cross_attention_cache` once, `init_cache`, then `decode_step` per token.
    """

    def __init__(self, vocab_size, d_model=512, ffn_dim=1024, num_heads=4, encoder_layers=6, decoder_layers=6,
                 norm="post", deepnorm_rule="paper", dropout=0.1, attention_dropout=0.0, activation_dropout=0.0,
                 pad_id=0, layer_norm_epsilon=LAYER_NORM_EPSILON, source_vocab_size=None, qkv_gain=TOOLKIT_QKV_GAIN,
                 **kwargs):
        super().__init__(**kwargs)
        _check_positive_ints(vocab_size=vocab_size, d_model=d_model, ffn_dim=ffn_dim, num_heads=num_heads,
                             encoder_layers=encoder_layers, decoder_layers=decoder_layers,
                             **({} if source_vocab_size is None else dict(source_vocab_size=source_vocab_size)))
        (enc_alpha, enc_beta), (dec_alpha, dec_beta) = _alpha_beta(norm, encoder_layers, decoder_layers, deepnorm_rule)
        self.config_args = dict(
            vocab_size=vocab_size, d_model=d_model, ffn_dim=ffn_dim, num_heads=num_heads,
            encoder_layers=encoder_layers, decoder_layers=decoder_layers, norm=norm, deepnorm_rule=deepnorm_rule,
            dropout=dropout, attention_dropout=attention_dropout, activation_dropout=activation_dropout,
            pad_id=pad_id, layer_norm_epsilon=layer_norm_epsilon, source_vocab_size=source_vocab_size,
            qkv_gain=float(qkv_gain),
        )
        self.vocab_size, self.d_model, self.num_heads = vocab_size, d_model, num_heads
        self.norm, self.pad_id = norm, pad_id
        self.embedding = ScaledTokenEmbedding(vocab_size, d_model, dtype=self.dtype_policy, name="embedding")
        self.source_embedding = None if source_vocab_size is None else ScaledTokenEmbedding(
            source_vocab_size, d_model, dtype=self.dtype_policy, name="source_embedding")
        self.embedding_dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy)
        block_args = dict(d_model=d_model, num_heads=num_heads, ffn_dim=ffn_dim, norm=norm, dropout=dropout,
                          attention_dropout=attention_dropout, activation_dropout=activation_dropout,
                          activation="relu", layer_norm_epsilon=layer_norm_epsilon, qkv_gain=qkv_gain,
                          dtype=self.dtype_policy)
        self.encoder_blocks = [
            TransformerEncoderBlock(alpha=enc_alpha, beta=enc_beta, name=f"encoder_{i}", **block_args)
            for i in range(encoder_layers)
        ]
        self.decoder_blocks = [
            TransformerDecoderBlock(alpha=dec_alpha, beta=dec_beta, name=f"decoder_{i}", **block_args)
            for i in range(decoder_layers)
        ]
        self.encoder_final_norm = _final_norm(norm, layer_norm_epsilon, self.dtype_policy, "encoder_final_norm")
        self.decoder_final_norm = _final_norm(norm, layer_norm_epsilon, self.dtype_policy, "decoder_final_norm")

    def build(self, input_shape=None):
        shape = (None, None, self.d_model)
        self.embedding.build()
        if self.source_embedding is not None:
            self.source_embedding.build()
        for block in self.encoder_blocks:
            block.build(shape)
        for block in self.decoder_blocks:
            block.build(shape, shape)
        for norm in (self.encoder_final_norm, self.decoder_final_norm):
            if norm is not None:
                norm.build(shape)
        self.built = True

    def encode(self, source_ids, training=None, mask=None, positions=None):
        """(B, S) ids -> encoder output (B, S, d) and the source padding mask (B, 1, S). Packed rows pass
        their self-attention `mask` (B, S, S) and `positions` (B, S)."""
        mask = padding_mask(source_ids, self.pad_id) if mask is None else mask
        embedding = self.embedding if self.source_embedding is None else self.source_embedding
        x = self.embedding_dropout(embedding(source_ids, positions=positions), training=training)
        for block in self.encoder_blocks:
            x = block(x, padding_mask=mask, training=training)
        if self.encoder_final_norm is not None:
            x = self.encoder_final_norm(x)
        return x, mask

    def _output(self, x):
        if self.decoder_final_norm is not None:
            x = self.decoder_final_norm(x)
        return self.embedding.project(x)

    def decode(self, decoder_input_ids, encoder_output, encoder_padding_mask, training=None, decoder_mask=None,
               positions=None):
        """Teacher-forced decoder: (B, T) ids -> logits (B, T, vocab). Packed rows pass their
        self-attention `decoder_mask` (B, T, T; the block adds the causal mask), `positions` (B, T), and
        the cross-attention mask (B, T, S) as `encoder_padding_mask`."""
        decoder_mask = padding_mask(decoder_input_ids, self.pad_id) if decoder_mask is None else decoder_mask
        x = self.embedding_dropout(self.embedding(decoder_input_ids, positions=positions), training=training)
        for block in self.decoder_blocks:
            x = block(x, encoder_output, decoder_padding_mask=decoder_mask,
                      encoder_padding_mask=encoder_padding_mask, training=training)
        return self._output(x)

    def call(self, inputs, training=None):
        if "source_segments" not in inputs:  # one sentence pair a row
            encoder_output, mask = self.encode(inputs["source_ids"], training=training)
            return self.decode(inputs["decoder_input_ids"], encoder_output, mask, training=training)
        source, target = inputs["source_segments"], inputs["decoder_segments"]
        encoder_output, _ = self.encode(inputs["source_ids"], training, mask=segment_mask(source, source),
                                        positions=inputs["source_positions"])
        return self.decode(inputs["decoder_input_ids"], encoder_output, segment_mask(target, source), training,
                           decoder_mask=segment_mask(target, target), positions=inputs["decoder_positions"])

    # Incremental decoding (beam search) ------------------------------------------------------------
    def init_cache(self, batch_size, max_length):
        """Empty self-attention caches: one (2, B, H, max_length, dk) zeros tensor per decoder layer."""
        shape = (2, batch_size, self.num_heads, max_length, self.d_model // self.num_heads)
        # From numpy: jax would compile a fill program for every new shape.
        zeros = np.zeros(shape, "float32")
        return [ops.convert_to_tensor(zeros, dtype=self.compute_dtype) for _ in self.decoder_blocks]

    def cross_attention_cache(self, encoder_output):
        """Keys and values of the encoder output, one (2, B, H, S, dk) tensor per decoder layer."""
        return [block.cross_attention.compute_key_value_cache(encoder_output) for block in self.decoder_blocks]

    def decode_step(self, token_ids, index, encoder_padding_mask, self_attention_cache, cross_attention_cache):
        """One decoding step at position `index`: token_ids (B, 1) -> (logits (B, vocab), new caches).

        Equals `decode` on the whole prefix, position by position (tested), but costs O(index) per
        token instead of O(index^2). The caches are lists with one tensor per layer, so that a step
        writes each layer's new keys and values in place of copying all layers into a new stack.
        """
        x = self.embedding(token_ids, start_position=index)
        caches = []
        for block, cache, cross in zip(self.decoder_blocks, self_attention_cache, cross_attention_cache):
            x, cache = block(x, encoder_padding_mask=encoder_padding_mask, self_attention_cache=cache,
                             cache_update_index=index, cross_attention_cache=cross, training=False)
            caches.append(cache)
        return self._output(x)[:, 0], caches

    def get_config(self):
        config = super().get_config()
        config.update(self.config_args)
        return config

    @classmethod
    def from_config(cls, config):
        # Checkpoints saved before qkv_gain existed were initialised with gain 1 on W^Q, W^K, W^V.
        return super().from_config({"qkv_gain": 1.0, **config})


@keras.saving.register_keras_serializable(package=_PACKAGE)
class BertMaskedLM(keras.Model):
    """BERT encoder with a masked-LM head (BERT-base by default) and an optional next-sentence head.

        h_0 = LN(E_tok[w] + E_pos[p] + E_seg[s]);  h_l = EncoderBlock_l(h_{l-1});  H = [LN](h_L)
        masked-LM logits = LN(GELU(H W_t + b_t)) E_tok^T + b_out      (at `mask_positions`)
        next-sentence logits = tanh(H[:, 0] W_p + b_p) W_nsp + b_nsp   (with next_sentence=True)

    [LN] is Pre-LN's final LayerNorm. The defaults are Devlin et al. 2019's BERT (google-research/bert
    modeling.py; with norm="post" this is keras-hub's `BertBackbone` plus the heads, tested with copied
    weights): GELU in its tanh approximation in the FFN and the masked-LM transform
    (activation="gelu_tanh"), LayerNorm eps 1e-12, and every embedding and dense kernel from a truncated
    normal with std 0.02 (initializer="bert"; DeepNorm scales V, O, W^1, W^2 by beta); biases zero,
    LayerNorm gamma one and beta zero. activation="gelu" and initializer="xavier" give the exact GELU and
    the paper's Xavier init; `qkv_gain` multiplies W^Q, W^K, W^V's initializer (1, as in BERT and
    fairseq's RoBERTa, which draw them with std 0.02 like every other kernel).

    Inputs: {"token_ids": (B, T), "segment_ids": (B, T) optional, "mask_positions": (B, P) optional}.
    Output: {"mlm_logits": (B, P, vocab) (or (B, T, vocab) without mask_positions),
             "nsp_logits": (B, 2) when next_sentence=True}.
    """

    def __init__(self, vocab_size, num_layers=12, d_model=768, num_heads=12, ffn_dim=3072, max_positions=512,
                 num_segments=2, norm="post", deepnorm_rule="paper", dropout=0.1, attention_dropout=0.1,
                 activation_dropout=0.0, next_sentence=False, pad_id=0, layer_norm_epsilon=BERT_LAYER_NORM_EPSILON,
                 activation="gelu_tanh", initializer="bert", qkv_gain=1.0, **kwargs):
        super().__init__(**kwargs)
        _check_positive_ints(vocab_size=vocab_size, num_layers=num_layers, d_model=d_model, num_heads=num_heads,
                             ffn_dim=ffn_dim, max_positions=max_positions, num_segments=num_segments)
        (alpha, beta), _ = _alpha_beta(norm, num_layers, 0, deepnorm_rule)
        self.config_args = dict(
            vocab_size=vocab_size, num_layers=num_layers, d_model=d_model, num_heads=num_heads, ffn_dim=ffn_dim,
            max_positions=max_positions, num_segments=num_segments, norm=norm, deepnorm_rule=deepnorm_rule,
            dropout=dropout, attention_dropout=attention_dropout, activation_dropout=activation_dropout,
            next_sentence=next_sentence, pad_id=pad_id, layer_norm_epsilon=layer_norm_epsilon,
            activation=activation, initializer=initializer, qkv_gain=float(qkv_gain),
        )
        self.vocab_size, self.d_model, self.norm, self.pad_id = vocab_size, d_model, norm, pad_id
        self.next_sentence, self.activation = next_sentence, activation
        dtype = self.dtype_policy
        self.embedding = BertEmbedding(vocab_size, d_model, max_positions=max_positions, num_segments=num_segments,
                                       dropout=dropout, layer_norm_epsilon=layer_norm_epsilon, dtype=dtype,
                                       name="embedding")
        self.encoder_blocks = [
            TransformerEncoderBlock(d_model, num_heads, ffn_dim, norm=norm, dropout=dropout,
                                    attention_dropout=attention_dropout, activation_dropout=activation_dropout,
                                    activation=activation, alpha=alpha, beta=beta,
                                    layer_norm_epsilon=layer_norm_epsilon, initializer=initializer,
                                    qkv_gain=qkv_gain, dtype=dtype, name=f"encoder_{i}")
            for i in range(num_layers)
        ]
        self.final_norm = _final_norm(norm, layer_norm_epsilon, dtype, "final_norm")
        bert_init = bert_normal()  # the heads: google-research/bert run_pretraining.py, std 0.02 whatever `initializer`
        self.mlm_transform = keras.layers.Dense(d_model, kernel_initializer=bert_init, dtype=dtype,
                                                name="mlm_transform")
        self.mlm_norm = keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, dtype=dtype, name="mlm_norm")
        if next_sentence:
            self.pooler = keras.layers.Dense(d_model, activation="tanh", kernel_initializer=bert_init, dtype=dtype,
                                             name="pooler")
            self.nsp_classifier = keras.layers.Dense(2, kernel_initializer=bert_init, dtype=dtype,
                                                     name="nsp_classifier")

    def build(self, input_shape=None):
        shape = (None, None, self.d_model)
        self.embedding.build()
        for block in self.encoder_blocks:
            block.build(shape)
        if self.final_norm is not None:
            self.final_norm.build(shape)
        self.mlm_transform.build(shape)
        self.mlm_norm.build(shape)
        self.mlm_bias = self.add_weight(shape=(self.vocab_size,), initializer="zeros", name="mlm_bias")
        if self.next_sentence:
            self.pooler.build((None, self.d_model))
            self.nsp_classifier.build((None, self.d_model))
        self.built = True

    def encode(self, token_ids, segment_ids=None, training=None):
        """(B, T) ids -> sequence output (B, T, d), after the final LN for Pre-LN."""
        mask = padding_mask(token_ids, self.pad_id)
        x = self.embedding(token_ids, segment_ids, training=training)
        for block in self.encoder_blocks:
            x = block(x, padding_mask=mask, training=training)
        return self.final_norm(x) if self.final_norm is not None else x

    def call(self, inputs, training=None):
        x = self.encode(inputs["token_ids"], inputs.get("segment_ids"), training=training)
        outputs = {}
        h = x
        if inputs.get("mask_positions") is not None:  # (B, P, d): only the masked positions
            positions = ops.cast(inputs["mask_positions"], "int32")
            h = ops.take_along_axis(x, ops.expand_dims(positions, -1), axis=1)
        h = self.mlm_norm(activate(self.mlm_transform(h), self.activation))
        outputs["mlm_logits"] = self.embedding.project(h) + ops.cast(self.mlm_bias, h.dtype)
        if self.next_sentence:
            outputs["nsp_logits"] = self.nsp_classifier(self.pooler(x[:, 0]))
        return outputs

    def get_config(self):
        config = super().get_config()
        config.update(self.config_args)
        return config


@keras.saving.register_keras_serializable(package=_PACKAGE)
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Label-smoothed cross entropy over non-padding tokens (fairseq `label_smoothed_cross_entropy`).

        q(y) = 1 - eps,  q(v != y) = eps / (V - 1)
        loss = sum_{tokens t, y_t != pad} -sum_v q(v) log p_t(v)  /  #non-pad tokens

    eps = 0 gives plain cross entropy. Logits are (B, T, V) (or (B, V)), labels (B, T) (or (B,)).
    Returns the mean over non-padding tokens (a scalar).
    """

    def __init__(self, epsilon=0.1, pad_id=0, name="label_smoothed_cross_entropy", **kwargs):
        kwargs["reduction"] = "sum_over_batch_size"  # the scaling in `call` relies on it
        super().__init__(name=name, **kwargs)
        if not 0.0 <= epsilon < 1.0:
            raise ValueError(f"label smoothing epsilon must be in [0, 1), got {epsilon}.")
        self.epsilon, self.pad_id = epsilon, pad_id

    def call(self, y_true, y_pred):
        labels = ops.cast(y_true, "int32")
        log_probs = ops.log_softmax(ops.cast(y_pred, "float32"), axis=-1)
        nll = -ops.squeeze(ops.take_along_axis(log_probs, ops.expand_dims(labels, -1), axis=-1), -1)
        vocab = ops.shape(log_probs)[-1]
        eps_other = self.epsilon / ops.cast(vocab - 1, "float32")
        loss = (1.0 - self.epsilon - eps_other) * nll + eps_other * -ops.sum(log_probs, axis=-1)
        weights = ops.cast(ops.not_equal(labels, self.pad_id), "float32")
        # Per-token terms scaled so that Keras's "sum over batch size" reduction gives
        # sum(loss * weights) / sum(weights); Keras then also divides by the replica count under
        # tf.distribute, which a scalar returned here would skip.
        return loss * weights / ops.maximum(ops.mean(weights), 1.0 / ops.cast(ops.size(weights), "float32"))

    def get_config(self):
        config = super().get_config()
        config.update(epsilon=self.epsilon, pad_id=self.pad_id)
        return config
