"""The machinery behind train_nmt.py, pretrain_bert.py and analyze_grads.py; the reproduction itself is at
the top level (layers.py, models.py, schedules.py, optimizers.py and the three scripts).

The jobs, each the Keras side of one script (the script is its command line, without Keras):
    nmt_job.py       translation: data, model, training through model.fit, test BLEU, --eval-only
    bert_job.py      BERT masked-LM pretraining;  glue.py: GLUE fine-tuning of its checkpoints
    grads_job.py     the analyses at initialization (Lemma 2, Figure 3, Theorem 1, DeepNet's bound)

What the jobs train with:
    rundir.py        RunDir: a run directory's config, state, metrics, checkpoints and resume point
    callbacks.py     the batches as PyDatasets and the callbacks of model.fit; progress lines
    decoding.py      beam search, BLEU, --translate
    devices.py       devices, distribution and precision;  processes.py: several processes as one
    optimizer_flags.py   the optimizer and schedule the flags ask for
    backend.py       the backend-specific gradient and compile helpers
    private_api.py   every use of private Keras and JAX API, with the versions it works around

Data:   nmt_data.py, synthetic.py, iwslt14.py, wmt14.py (translation);  bert_data.py (BERT, GLUE)
Runs:   sweeps.py (the papers' comparisons as lists of runs), plots.py (every figure),
        benchmark.py and flops.py (train_nmt.py --benchmark)
Without Keras, for the command lines: cli.py (shared flags, run_script), constants.py (names and defaults
every module reads), errors.py (one-line errors and their exit codes), files.py (atomic JSON and CSV).
"""
