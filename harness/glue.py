"""GLUE fine-tuning of pretrain_bert.py's checkpoints (Figure 5(b, c)): `pretrain_bert.py --finetune mrpc|rte`.

    KERAS_BACKEND=torch python pretrain_bert.py --finetune mrpc --glue-dir glue/ --init runs/fig5/post-warmup

Devlin et al. 2019, Section 4.1: a new pooler and classifier on the pretrained encoder's [CLS] state,
AdamW with a linear warmup over the first 10 % of the updates, then linear decay; Xiong et al. 2020,
Appendix A: several seeds per checkpoint (the paper's 6), dev accuracy with its 95 % interval.
"""

import json
import math
import os
import zipfile

import keras
import numpy as np
from scipy import stats

from harness import bert_data, devices
from harness.console import UsageError, check_warmup
from harness.callbacks import load_checkpoint
from harness.files import CONFIG, prepare_out_dir
from harness.plots import plot_panels
from harness.rundir import RunDir, code_version
from models import BertMaskedLM
from optimizers import bert_optimizer
from schedules import make_schedule

FINETUNE_WARMUP = 0.1  # BERT's run_classifier: linear warmup over the first 10 % of the updates


def run(spec, out):
    """--finetune, what the spec asks for: `finetune`, given the parts of the spec it uses, and its fields for
    config.json."""
    devices.tune_runtime()
    return finetune(spec.finetuning, spec.optimization, spec.training, spec.devices, spec.seq_len, out,
                    spec.config())


def load_bert_checkpoint(path):
    """A BertMaskedLM checkpoint of this script (model and optimizer state)."""
    return load_checkpoint(path, expect=BertMaskedLM)


def sentence_pair_classifier(encoder, seq_len, num_labels=2, dropout=0.1):
    """BERT's sentence-pair classifier on a pretrained encoder (Devlin et al. 2019, Section 4.1):

        h = Encoder([CLS] a [SEP] b [SEP])[:, 0]                 (the [CLS] state)
        logits = W_c drop(tanh(W_p h + b_p)) + b_c               (a new pooler and classifier)

    A functional model over `encoder.encode`: it shares the encoder's embedding and blocks, and leaves
    out the pretraining heads (masked LM, NSP). The pooler and classifier are named "pooler" and
    "classifier" (`finetune_seed` re-initialises them).
    """
    init = keras.initializers.TruncatedNormal(stddev=0.02)
    pooler = keras.layers.Dense(encoder.d_model, activation="tanh", kernel_initializer=init, name="pooler")
    classifier = keras.layers.Dense(num_labels, kernel_initializer=init, name="classifier")
    token_ids = keras.Input((seq_len,), dtype="int32", name="token_ids")
    segment_ids = keras.Input((seq_len,), dtype="int32", name="segment_ids")
    h = encoder.encode(token_ids, segment_ids)[:, 0]
    logits = classifier(keras.layers.Dropout(dropout)(pooler(h)))
    return keras.Model({"token_ids": token_ids, "segment_ids": segment_ids}, logits, name="sentence_pair_classifier")


def confidence_interval(values, level=0.95):
    """(mean, half-width) of the t-interval: mean +- t_{(1+level)/2, n-1} s / sqrt(n), s the sample std."""
    values = np.asarray(values, "float64")
    if len(values) < 2:
        return float(values.mean()), float("nan")
    return float(values.mean()), float(stats.t.ppf((1 + level) / 2, len(values) - 1) * values.std(ddof=1)
                                       / math.sqrt(len(values)))


def checkpoint_paths(inits):
    """--init values -> .keras files; a run directory (or a folder of checkpoints) gives all its
    checkpoints/stepN.keras, by N (`RunDir.step_checkpoints`)."""
    paths = []
    for path in inits:
        run = RunDir(path)
        folder = run.checkpoints if os.path.isdir(run.checkpoints) else path
        if os.path.isdir(folder):
            found = run.step_checkpoints(folder)
            if not found:
                raise UsageError(f"--init {path}: no checkpoints/stepN.keras inside; pass a pretrain_bert.py run")
            paths += found
        else:
            paths.append(path)
    return paths


def pretrained_config(path):
    """The checkpoint's model config and its run directory's tokenizer path, checked before any training."""
    if not os.path.isfile(path):
        raise UsageError(f"--init {path}: file not found")
    try:
        with zipfile.ZipFile(path) as archive:
            saved = json.loads(archive.read("config.json"))
    except (zipfile.BadZipFile, KeyError, ValueError):
        raise UsageError(f"--init {path}: not a Keras .keras file; pass a checkpoint of pretrain_bert.py") from None
    if saved.get("class_name") != "BertMaskedLM":
        raise UsageError(f"--init {path}: a {saved.get('class_name')} checkpoint, another architecture; fine-tuning "
                         "needs a BertMaskedLM checkpoint of pretrain_bert.py (runs/NAME/checkpoints/stepN.keras)")
    run_dir = RunDir.of_checkpoint(path)
    try:
        tokenizer = run_dir.config()["tokenizer"]
    except (OSError, ValueError, KeyError):
        raise UsageError(f"--init {path}: {run_dir.file(CONFIG)} names no tokenizer; the checkpoint must stay "
                         "in its pretrain_bert.py run directory (RUN/checkpoints/, RUN/vocab/)") from None
    return saved["config"], run_dir.file(tokenizer), os.path.basename(run_dir.path)


def compiled_classifier(optimization, config, seq_len, total, setup):
    """The classifier for encoders of one architecture (`config`) on pairs of `seq_len` tokens, compiled
    once: `finetune_seed` resets it.

    AdamW of the spec's optimization part `optimization` with BERT's fine-tuning schedule over `total`
    updates: linear warmup over the first 10 %, then linear decay to 0.
    """
    encoder = BertMaskedLM.from_config(config)
    encoder.build()
    model = sentence_pair_classifier(encoder, seq_len)
    check_warmup(round(FINETUNE_WARMUP * total), total, longer="--epochs")
    schedule = make_schedule("linear", optimization.lr, round(FINETUNE_WARMUP * total), total)
    model.compile(optimizer=bert_optimizer(optimization, schedule),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=devices.compile_xla(setup))
    setup.build(model, None)  # the optimizer's slots now, not inside the first traced step (one device: no batch)
    return model, encoder


class EpochBatches(keras.utils.PyDataset):
    """The training batches of all fine-tuning epochs as one sequence, epoch after epoch: `model.fit` reads
    it with `steps_per_epoch` batches an epoch and shuffle=False (the order is drawn here).

    Epoch e permutes the training pairs with the seed [seed, e] and takes the full batches of
    `bert_data.batch_rows` in that order (the pairs left over are skipped that epoch; with fewer pairs
    than a batch, the one batch wraps around). A batch depends on its index alone, so a backend that
    prefetches the next epoch's batches gets the same ones.
    """

    def __init__(self, train, batch_size, epochs, seed):
        super().__init__()
        self.train = train
        count = len(train[0])
        self.steps_per_epoch = max(1, count // batch_size)
        self.rows = []
        for epoch in range(epochs):
            order = np.random.default_rng([seed, epoch]).permutation(count)
            self.rows += [order[rows] for rows, _ in bert_data.batch_rows(count, batch_size)[:self.steps_per_epoch]]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        rows = self.rows[index]
        return {"token_ids": self.train[0][rows], "segment_ids": self.train[1][rows]}, self.train[2][rows]


class SeedFirstUpdate(keras.callbacks.Callback):
    """`keras.utils.set_random_seed(seed)` again just before the first update of `model.fit`, once fit has set
    up its input pipeline: under the torch backend that pipeline (a torch DataLoader) draws from torch's
    global generator, which the torch backend's dropout uses too; without this, reading the batches
    through fit would change the dropout masks."""

    def __init__(self, seed):
        super().__init__()
        self.seed = seed

    def on_train_batch_begin(self, batch, logs=None):
        if self.seed is not None:
            keras.utils.set_random_seed(self.seed)
            self.seed = None


class DevAccuracy(keras.callbacks.Callback):
    """Dev accuracy after each epoch of `model.fit`: `self.epochs` gets {epoch, train_loss, dev_accuracy},
    train_loss the mean loss of the epoch's batches. The dev pairs go through in fixed-size batches
    (`bert_data.batch_rows`: one compiled shape), the rows that wrap around not counted."""

    def __init__(self, dev, batch_size):
        super().__init__()
        self.dev, self.batch_size, self.epochs = dev, batch_size, []

    def on_epoch_end(self, epoch, logs=None):
        tokens, segments, labels = self.dev
        correct = 0
        for rows, real in bert_data.batch_rows(len(tokens), self.batch_size):
            logits = self.model.predict_on_batch({"token_ids": tokens[rows], "segment_ids": segments[rows]})
            correct += int((np.asarray(logits)[:real].argmax(-1) == labels[rows][:real]).sum())
        self.epochs.append(dict(epoch=epoch + 1, train_loss=float(logs["loss"]), dev_accuracy=correct / len(tokens)))


def finetune_seed(finetuning, training, classifier, weights, train, dev, seed):
    """Fine-tune from the pretrained `weights` with one seed (`model.fit`, --epochs epochs of --batch-size
    pairs: the spec's fine-tuning and training parts): dev accuracy after each epoch.

    The seed draws the new pooler and classifier (truncated normal, std 0.02) and the order of the training
    pairs (`EpochBatches`); the optimizer starts afresh (its step count and moments set to 0), so the
    learning-rate schedule starts again at its warmup.
    """
    model, encoder = classifier
    keras.utils.set_random_seed(seed)
    encoder.set_weights(weights)
    init = keras.initializers.TruncatedNormal(stddev=0.02, seed=seed)
    for layer in (model.get_layer("pooler"), model.get_layer("classifier")):
        layer.kernel.assign(init(layer.kernel.shape))
        layer.bias.assign(keras.ops.zeros(layer.bias.shape))
    for variable in model.optimizer.variables:
        variable.assign(keras.ops.zeros(variable.shape, variable.dtype))
    batches = EpochBatches(train, training.batch_size, finetuning.epochs, seed)
    evaluation = DevAccuracy(dev, training.batch_size)
    model.fit(batches, epochs=finetuning.epochs, steps_per_epoch=batches.steps_per_epoch, shuffle=False, verbose=0,
              callbacks=[SeedFirstUpdate(seed), evaluation])
    return evaluation.epochs


def finetune(finetuning, optimization, training, device_settings, seq_len, out, settings):
    """--finetune TASK: fine-tune every --init checkpoint with --seeds seeds (the spec's fine-tuning part
    `finetuning`), on pairs of `seq_len` tokens, with its optimization and training parts, on one device of its
    devices part; config.json (`settings`, the spec's fields, with the checkpoints), results.csv, finetune.csv
    and finetune.png in the directory `out`."""
    if device_settings.distribute in ("data", "model"):
        raise UsageError("--finetune runs on one device (GLUE tasks are small); drop --distribute "
                         f"{device_settings.distribute}")
    setup = devices.configure(device_settings.but(distribute="none"))  # one device, --precision
    checkpoints = checkpoint_paths(finetuning.init)
    configs = [pretrained_config(path) for path in checkpoints]  # every --init checked before any training
    glue = bert_data.read_glue(finetuning.glue_dir, finetuning.finetune)
    run_dir = RunDir(prepare_out_dir(out))
    run_dir.write_config(settings, dict(checkpoints=checkpoints))
    task = bert_data.GLUE_TASKS[finetuning.finetune]["name"]
    print(f"{task}: {len(glue['train'])} training and {len(glue['dev'])} dev pairs; {len(checkpoints)} checkpoints "
          f"x {finetuning.seeds} seeds, {finetuning.epochs} epochs, batch {training.batch_size}, "
          f"lr {optimization.lr:g}")
    epoch_rows, summary, classifiers, version = [], [], {}, code_version()
    for path, (config, tokenizer_path, run) in zip(checkpoints, configs):
        tokenizer = bert_data.load_tokenizer(tokenizer_path)
        if tokenizer.get_vocab_size() != config["vocab_size"]:
            raise UsageError(f"--init {path}: the model has {config['vocab_size']} word pieces but {tokenizer_path} "
                             f"{tokenizer.get_vocab_size()}; the checkpoint and its run directory do not match")
        if seq_len > config["max_positions"]:
            raise UsageError(f"--seq-len {seq_len} is longer than the checkpoint's {config['max_positions']} "
                             "positions")
        pretrained = load_bert_checkpoint(path)
        updates = int(np.asarray(pretrained.optimizer.iterations)) if pretrained.optimizer else None
        train, dev = (bert_data.encode_sentence_pairs(glue[s], tokenizer, seq_len) for s in ("train", "dev"))
        architecture = json.dumps({k: v for k, v in config.items() if k != "name"}, sort_keys=True, default=str)
        if architecture not in classifiers:  # one compilation per architecture (Post-LN, Pre-LN, ...)
            # Seeded first: the dropout layers draw their generators' seeds when they are built, so the same
            # flags give the same dropout masks, and the same accuracies, in every process.
            keras.utils.set_random_seed(training.seed)
            total = finetuning.epochs * max(1, len(train[0]) // training.batch_size)  # --epochs of full batches
            classifiers[architecture] = compiled_classifier(optimization, config, seq_len, total, setup)
        finals = []
        for seed in range(1, finetuning.seeds + 1):
            epochs = finetune_seed(finetuning, training, classifiers[architecture],
                                   pretrained.get_weights(), train, dev, seed)
            epoch_rows += [dict(checkpoint=path, run=run, pretraining_updates=updates, seed=seed, **e) for e in epochs]
            finals.append(epochs[-1]["dev_accuracy"])
            run_dir.write_csv("finetune.csv", epoch_rows)
        mean, half = confidence_interval(finals)
        summary.append(dict(checkpoint=path, run=run, pretraining_updates=updates, seeds=len(finals),
                            dev_accuracy_mean=mean, dev_accuracy_ci95=half,
                            accuracies=" ".join(f"{a:.4f}" for a in finals), code_version=version["fingerprint"],
                            measured=version["measured"]))
        run_dir.write_csv("results.csv", summary)
        print(f"{run} update {updates}: {task} dev accuracy {100 * mean:.2f} +- {100 * half:.2f} "
              f"(95 % CI over {len(finals)} seeds)", flush=True)
    plot_accuracies(run_dir.file("finetune.png"), task, summary)
    run_dir.write_results(dict(task=task, seeds=finetuning.seeds, epochs=finetuning.epochs, lr=optimization.lr,
                               batch_size=training.batch_size, checkpoints=summary))
    return summary


def plot_accuracies(path, task, summary):
    """finetune.png: each pretraining run's dev accuracy (mean and 95 % interval over the seeds) against the
    updates of its checkpoints (`summary`: the rows of results.csv)."""
    runs = {}
    for row in summary:
        xs, ys, errs = runs.setdefault(row["run"], ([], [], []))
        xs.append(row["pretraining_updates"] or 0)
        ys.append(row["dev_accuracy_mean"])
        errs.append(row["dev_accuracy_ci95"])
    plot_panels(path, "pretraining updates", [(f"{task} dev accuracy", runs)])
