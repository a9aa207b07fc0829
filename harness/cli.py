"""The scripts' command lines, without Keras: their flags, made from their specs' fields, their shared
checks, and how a script starts.

    d_model: int = setting(group="model", help="model width d")      # harness/specs.py: a field and its flag
    p = spec_parser(TranslationSpec, "train_nmt.py", __doc__)         # --d-model ... [preset: cpu 128, ...]
    sys.exit(run_script("train_nmt.py", argv, parse_args, check_args, run))

Each setting of a script is declared once, as a field of its spec (harness/specs.py) made by `setting`,
with its default, help and choices; `spec_parser` makes the script's parser from those fields. It is
argparse by hand, so that the command lines need no dependency and the scripts' help and one-line
refusals (`console.OneLineParser`) stay argparse's own.

Each script (train_nmt.py, pretrain_bert.py, analyze_grads.py) is its command line: it imports only
modules without Keras (this one, errors, runs, the data modules), so that `--help` and the one-line
error for a bad KERAS_BACKEND need no working backend. `run_script` reads and checks the flags, then the
backend (a refusal needs no backend import), then calls the
script's `run`, which imports the Keras side of the job (harness/nmt_job.py, harness/bert_job.py,
harness/grads_job.py) in its one marked line. Every other module imports at its top.
"""

import argparse
import dataclasses
import importlib.util
import json
import os
import shutil
import sys
import typing
from dataclasses import dataclass

from harness import files, private_api, rundir
from harness.console import (WRITE_EXIT_CODE, DataError, Interrupted, OneLineParser, UsageError, WriteError,
                            catch_interrupts, interrupted)
from harness.files import CONFIG, LOCK, drop_lock_file, holds_run, prepare_out_dir, unlock_run_dirs
from harness.rundir import RunDir
from harness.specs import flag_name


_NOT_GIVEN = object()


def given_flags(build_parser, argv):
    """{dest: value} of the flags the command line `argv` gives, whatever the parser's defaults.

    `build_parser()` makes the script's parser. argv is parsed once as usual (argparse's own errors and
    --help), then once more by a parser whose every default is a marker, so that a flag given with its
    default value (`--seed 1`) still counts as given: what an experiment's spec lets the user override.
    """
    parsed = build_parser().parse_args(argv)
    probe = build_parser()
    probe.set_defaults(**{dest: _NOT_GIVEN for dest in vars(parsed)})
    return {dest: value for dest, value in vars(probe.parse_args(argv)).items() if value is not _NOT_GIVEN}


@dataclass(frozen=True)
class Command:
    """A script's command line once parsed: the job's spec (harness/specs.py) and, for --sweep, the
    sweep's own flags: which experiment, which of its runs, the depths, and runs at a time."""

    spec: object
    sweep: str | None = None
    runs: tuple | None = None
    depths: tuple | None = None
    jobs: int = 1


def spec_parser(spec_class, prog, doc, after=None):
    """The parser of the script `prog` (its description: the first paragraph of `doc`): a flag for each field
    of `spec_class` (a spec's class) made by `setting`, group by group (the script's own options, then the
    spec's GROUPS, {title: description} in the order of --help), each group's in the order of the fields.
    `after` ({field: {name: setting}}) adds the script's own flags, which no spec holds (--sweep), after that
    field's.

    An int or float field (also `| None`) parses as one, a bool field is a switch (store_true); the flag's
    default is the field's, None for a field without one. --preset chooses among the spec's PRESETS, and the
    help of a flag a preset sets ends with its value at every preset, e.g. `[preset: cpu 128, iwslt 512, ...]`.
    """
    parser = OneLineParser(prog=prog, description=doc.split("\n\n")[0],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    flags = [(name, flag) for field in dataclasses.fields(spec_class)
             for name, flag in ((field.name, field), *(after or {}).get(field.name, {}).items())
             if "help" in flag.metadata]
    groups = {None: parser, **{title: parser.add_argument_group(title, text)
                               for title, text in spec_class.GROUPS.items()}}
    for title, group in groups.items():
        for name, flag in flags:
            if flag.metadata["group"] == title:
                _add_flag(group, name, flag, spec_class.PRESETS)
    return parser


def _add_flag(container, name, field, presets):
    """`container.add_argument` for the `setting` `field` named `name` (`spec_parser`)."""
    options = dict(field.metadata["options"], help=field.metadata["help"],
                   default=None if field.default is dataclasses.MISSING else field.default)
    if field.type is bool:
        options.setdefault("action", "store_true")
    numbers = [kind for kind in typing.get_args(field.type) or (field.type,) if kind in (int, float)]
    if numbers and "type" not in options:
        options["type"] = numbers[0]
    if name == "preset":
        options["choices"] = tuple(presets)
    if name in next(iter(presets.values())):
        shown = ", ".join(f"{preset} {_shown(values[name])}" for preset, values in presets.items())
        options["help"] = f"{options['help']} [preset: {shown}]"
    if field.metadata["positional"]:
        return container.add_argument(name, **options)
    return container.add_argument(flag_name(name), *field.metadata["aliases"], dest=name, **options)


def _shown(value):
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else value


# --- starting a script ----------------------------------------------------------------------------

def quiet_tensorflow():
    """Import TensorFlow, when it is the backend (KERAS_BACKEND tensorflow, or unset: Keras's default) and
    installed, with its C++ start-up lines kept off the terminal.

    TensorFlow's start-up prints lines about CUDA and absl logging. `TF_CPP_MIN_LOG_LEVEL` does not reach
    the lines printed before absl's logging starts, so standard error (file descriptor 2) points at
    /dev/null during the import. A TensorFlow that fails to import is left alone: the next import (Keras's)
    raises the error where it is seen. Under jax and torch nothing imports it (`check_backend`).
    """
    if os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow" or "tensorflow" in sys.modules \
            or importlib.util.find_spec("tensorflow") is None:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        import tensorflow  # noqa: F401
    except Exception:
        pass
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def check_backend(script):
    """Import keras (TensorFlow first, quietly), or return an error line naming KERAS_BACKEND and the fix."""
    quiet_tensorflow()
    try:
        import keras  # the check itself: the one import of Keras on the command-line side
    except Exception as error:  # an unknown or broken backend fails inside keras's import
        return (f"{script}: error: cannot start Keras with KERAS_BACKEND={os.environ.get('KERAS_BACKEND', '(unset)')}: "
                f"{str(error).splitlines()[0] if str(error) else type(error).__name__}; "
                "use jax, tensorflow or torch (pip install -r requirements.txt)")
    if keras.backend.backend() not in ("jax", "tensorflow", "torch"):
        return (f"{script}: error: KERAS_BACKEND={keras.backend.backend()} is not supported by this project; "
                "use jax, tensorflow or torch")
    os.environ["KERAS_BACKEND"] = keras.backend.backend()  # named for the script, and for its child processes
    if keras.backend.backend() != "tensorflow":
        private_api.keep_tensorflow_out()  # nothing of a jax or torch run needs it
    return None


def refuse_stray(stray, flag, hint="; add it, or leave the flag out"):
    """One line for flags (`stray`, dests) given without the mode they belong to (`flag`)."""
    if stray:
        raise UsageError(f"{', '.join(map(flag_name, sorted(stray)))} only applies with {flag}{hint}")


@dataclass(frozen=True)
class Mode:
    """A mode of a script's command line other than its training run: the `flag` that asks for it, the
    flags `own` to it (no other mode takes them), and the other flags it `takes` besides `DEVICE_FLAGS`
    (None: every flag), which its refusal sums up as `takes_what`."""

    flag: str
    own: tuple = ()
    takes: tuple | None = None
    takes_what: str = ""


DEVICE_FLAGS = ("distribute", "model_parallel", "precision", "peer_timeout")  # every mode takes them


def check_modes(modes, given, asked=None):
    """Refuse, with one line, a command line that asks for two of a script's `modes` ({dest: Mode}), gives
    a flag of a mode it does not ask for, or a flag its mode does not take. `given`: the dests the command
    line gives; `asked`: the modes it asks for (default: those of `modes` in `given`)."""
    asked = [dest for dest in modes if dest in given] if asked is None else asked
    if len(asked) > 1:
        raise UsageError(f"{' and '.join(modes[dest].flag for dest in asked)} are different modes; give one of them "
                         "per command line")
    mode = modes[asked[0]] if asked else None
    for dest, other in modes.items():
        if other is not mode:
            refuse_stray([d for d in other.own if d in given], other.flag,
                         f" (here: {mode.flag})" if mode else "; add it, or leave the flag out")
    if mode and mode.takes is not None:
        stray = sorted(set(given) - {asked[0], *mode.own, *mode.takes, *DEVICE_FLAGS})
        if stray:
            raise UsageError(f"{', '.join(map(flag_name, stray))} {'does' if len(stray) == 1 else 'do'} not apply to "
                             f"{mode.flag}, which {mode.takes_what}; leave {'it' if len(stray) == 1 else 'them'} out")


def refuse_warmup_clash(optimization):
    """One line for --no-warmup given together with --warmup-updates (`optimization`: the spec's part)."""
    if optimization.no_warmup and "no_warmup" in optimization.given and "warmup_steps" in optimization.given:
        raise UsageError(f"--no-warmup and --warmup-updates {optimization.warmup_steps} contradict each other; "
                         "give one of them")


def first_missing(path):
    """The outermost folder of `path` that does not exist yet (`path` itself, runs/ of runs/NAME, or
    /new of /new/run), which a failed start then removes whole; None when `path` is None or exists."""
    if not path or os.path.exists(path):
        return None
    path = os.path.abspath(path)
    while not os.path.exists(os.path.dirname(path)):
        path = os.path.dirname(path)
    return path


def claim_run_dir(path, resume=None, unit="epoch", asked=None):
    """Before the backend's import: create the run folder `path` and hold its lock (`files.lock_run_dir`),
    and for a training run (`resume` True or False) refuse a folder that holds a run without --resume, or
    none with it (`RunDir.start`), and with --resume a run that has ended and that the updates `asked(run_dir)`
    train no further (`RunDir.refuse_ended`). What reads only paths is refused in a fraction of a second."""
    if resume is None:
        return prepare_out_dir(path)
    run_dir = RunDir.start(path, resume, unit)
    if resume:
        run_dir.refuse_ended(asked(run_dir))


# The settings that --resume may give anew: they extend or watch the run, and change no number it has.
RESUME_MAY_CHANGE = {"resume", "out", "epochs", "max_updates", "log_every", "backup_every", "peer_timeout"}


def resumed_flags(spec_class, given, out):
    """The flags of a --resume of the run in `out`: those its config.json recorded (`flags`, what the run was
    given), with `given`, the command line's, on top. A given setting that differs from the run's own and is
    not one of RESUME_MAY_CHANGE (it would change the model, the data or the vocabulary) is refused in one
    line with both values. Without --resume, or without a config.json in `out`, `given` as it is."""
    path = os.path.join(out, CONFIG)
    if not given.get("resume") or not os.path.isfile(path):
        return given
    with open(path, encoding="utf-8") as f:
        recorded = json.load(f)
    fields = {field.name for field in dataclasses.fields(spec_class)} - {"given"}
    # a run written before config.json recorded its flags: the values of those it was given, less the ones
    # its plan wrote over (the schedule as an object)
    flags = recorded.get("flags") or {k: recorded[k] for k in recorded.get("given", ()) if k in recorded}
    # every setting not given is the run's own, those meant to change included (a translation run that has ended
    # is then refused as such, `RunDir.refuse_ended`, not decoded again), but for a pause (`PAUSES`: BERT's
    # --max-updates), which the run goes on from
    flags = {k: v for k, v in flags.items() if k in fields and not isinstance(v, dict)
             and k not in ("resume", "out", *spec_class.PAUSES)}
    ran, now = spec_class.build(**flags), spec_class.build(**{**flags, **given})
    changed = [n for n in sorted(given) if n not in RESUME_MAY_CHANGE and getattr(ran, n) != getattr(now, n)]
    if changed:
        raise UsageError(f"--resume: {out} was trained with {flag_name(changed[0])} {_shown(getattr(ran, changed[0]))}, "
                         f"not {_shown(getattr(now, changed[0]))}; leave it out to continue the run as it was "
                         "(only --epochs and --max-updates extend it), or start a new run with another --out")
    return {**flags, **given}


def _remove_unsaved(created, claimed=None):
    """Remove the folder `created` (made by this command, with every folder below it) if no run in it saved
    its state yet (`files.holds_run`), and the lock file of the folder `claimed` if this process holds it and
    it is all that is in it: nothing half-written is left. Returns whether `created` was removed."""
    chief = files.is_chief()
    if chief and claimed and os.path.isdir(claimed) and os.listdir(claimed) == [LOCK]:  # empty before: as it was
        drop_lock_file(claimed)
    gone = bool(chief and created and os.path.isdir(created)) and not any(
        holds_run(root) for root, _, _ in os.walk(created))
    if gone:
        unlock_run_dirs()  # its lock file goes with it
        shutil.rmtree(created, ignore_errors=True)
    return gone


def run_script(name, argv, parse, check, run, out_dir=lambda args: None, claim=lambda args: None):
    """The `main()` of the project's scripts: bad input ends in one line and exit code 2.

    `parse(argv)` and `check(args)` read and check the flags, before Keras is imported (a refusal takes
    a fraction of a second, not the seconds of a backend's import); then the backend is checked, and
    `run(args)` does the work (and imports the Keras side: the backend works by then). Between the two, the
    run folder that `claim(args)` names, as `claim_run_dir`'s arguments (None: none), is taken: its lock, and
    the refusals that read only paths, which so need no backend either (a process of several training as one
    takes it in the job, once they have joined). A UsageError or a DataError prints `NAME: error: ...`
    and returns 2; if the run directory `out_dir(args)` was created by this call and no run in it saved
    its state yet (`files.holds_run`), it is removed with every folder above it that this call created
    (`first_missing`), and a folder that was there empty keeps no lock file: nothing half-written is left
    behind (by the chief of several processes, once the others have stopped too: `files.wait_for_others`). A
    WriteError (a full disk) prints its one line and returns 4, keeping what was saved for --resume.
    Returns the exit code.
    """
    rundir.code_version()  # the code as it starts, recorded in every result this run writes
    created = taken = None
    restore = catch_interrupts()  # Ctrl-C: one line and exit code 130
    try:
        try:
            args = parse(argv)  # --help prints and exits here: no backend is needed for it
        except SystemExit as done:  # argparse has printed its one-line error (OneLineParser)
            return done.code
        check(args)  # bad flags are refused before the backend's import, which takes seconds
        taken = None if files.several_named() else claim(args)
        if taken:
            created = first_missing(taken[0])
            claim_run_dir(*taken)
        problem = check_backend(name)
        if problem:
            raise UsageError(problem.split(": error: ", 1)[1])  # printed as the others are
        created = created or first_missing(out_dir(args))
        run(args)
    except (UsageError, DataError) as error:
        print(f"{name}: error: {error}", file=sys.stderr, flush=True)
        files.wait_for_others()
        _remove_unsaved(created, taken and taken[0])
        return 2
    except (Interrupted, KeyboardInterrupt) as error:  # Ctrl-C: one line, exit code 130 (console.on_interrupt)
        raise SystemExit(interrupted(name, error, saved=not _remove_unsaved(created, taken and taken[0])))
    except WriteError as error:
        print(f"{name}: error: {error}", file=sys.stderr, flush=True)
        return WRITE_EXIT_CODE
    finally:
        unlock_run_dirs()  # the run has ended: its folders are free for the next
        restore()
    return 0
