"""The machinery behind train_nmt.py, pretrain_bert.py and analyze_grads.py; the science is at the top level
(layers.py, models.py, schedules.py, optimizers.py and the scripts), and what reproduce.py runs on top of the
scripts, the experiments and their verification, in the package reproduction/.

A run's settings:
    specs.py         TranslationSpec, BertSpec, AnalysisSpec: one frozen dataclass per job, built once from
                     the command line (presets resolved, the schedule decided), with the presets themselves,
                     and the names and defaults every module reads (the flags' choices, token ids)

The jobs, each the Keras side of one script (the script holds its run top to bottom and its command line,
and imports these once the command line is checked):
    nmt_job.py       translation: data, model, callbacks, test BLEU; decoding (beam search, BLEU)
    translate.py     train_nmt.py --translate: a run's model on raw text (--eval-only is train_nmt.py's own)
    bert_job.py      BERT masked-LM pretraining;  glue.py: GLUE fine-tuning of its checkpoints
    grads_job.py     the analyses at initialization (Lemma 2, Figure 3, Theorem 1, DeepNet's bound)

What the jobs train with:
    rundir.py        RunDir: a run directory's files, and the one module that reads them; which code wrote a
                     run (the fingerprint of the code that computes numbers, the commit) (no Keras)
    callbacks.py     the batches as PyDatasets and the callbacks of model.fit; resuming: the newest checkpoint
                     that loads, and where the run goes on
    devices.py       devices, distribution and precision, the compilation cache; the backend-specific gradient
                     and compile helpers, and the rate of a schedule (lr_at)
    private_api.py   every use of private Keras and JAX API, with the versions it works around

Data:   nmt_data.py, synthetic.py, iwslt14.py, wmt14.py (translation);  bert_data.py (BERT, GLUE)
Figures and speed: plots.py (every figure), benchmark.py and flops.py (train_nmt.py --benchmark)
Without Keras, for the command lines: cli.py (shared flags, run_script), console.py (one-line errors and their
exit codes, Ctrl-C, progress lines), files.py (atomic JSON and CSV, what a checkpoint holds beside Keras's own,
several processes training as one and which of them writes).
"""
