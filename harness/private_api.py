"""Every use of private Keras and JAX API in the project, each in one small function that names the
versions it works around and the public API that would replace it. Nothing else in the project imports
`keras.src` or `jax._src`; if a release renames what a function here reaches, it fails here, loudly.

Written against keras 3.15.1, jax 0.10.2 and tensorflow 2.21.0 (requirements.txt). The backends' modules
are imported inside the functions (backend-specific code), so importing this module loads none of them.
"""

import sys


def keep_tensorflow_out():
    """[keras 3.15.1] Tell Keras, in a jax or torch process, that TensorFlow is not installed. Keras asks
    `module_utils.tensorflow.available`, which imports TensorFlow, when it seeds (`keras.utils.
    set_random_seed` seeds TensorFlow too, for tf.data pipelines) and when it serializes a config (for
    TensorFlow's types), so every jax or torch run imported TensorFlow for nothing it uses (its batches are
    `keras.utils.PyDataset`s, its tensors jax's or torch's): 3-4 s of start-up alone, about 10 s beside
    other work, and TensorFlow's CUDA lines on the terminal. Public replacement: none; this goes once Keras
    asks whether TensorFlow is imported rather than installed."""
    from keras.src.utils import module_utils

    if "tensorflow" not in sys.modules and module_utils.tensorflow._available is None:
        module_utils.tensorflow._available = False


def jax_coordination_client():
    """[jax 0.10.2] The client of jax's coordination service, which `jax.distributed.initialize` starts:
    its key-value store and barriers let the chief tell the other processes that the vocabulary is
    written (`files.chief_first`), and `get_live_nodes` tells which processes still answer
    (`files._watch_peers`). Public replacement: none yet; `jax.distributed` exposes only
    initialize, shutdown and is_initialized."""
    from jax._src import distributed

    return distributed.global_state.client


def keras_jax_initialize_rng():
    """[keras 3.15.1] What `keras.distribution.initialize` does after joining the processes: one random
    seed shared by every process unless the user set one. The public `keras.distribution.initialize`
    cannot be used because it also calls `jax.distributed.initialize` itself, without the timeouts
    that `files._join_jax` passes. Public replacement: `keras.distribution.initialize` once it takes
    jax's timeout arguments."""
    from keras.src.backend.jax.distribution_lib import initialize_rng

    initialize_rng()


def patch_keras_multi_worker_reduce():
    """[keras 3.15.1, tensorflow 2.21.0] Keras's tensorflow train step averages each replica's results
    (loss, metrics: scalars) over a MultiWorkerMirroredStrategy with `strategy.reduce("MEAN", value,
    axis=0)`, which fails on a scalar ("Invalid reduction dimension 0 for input with 0 dimensions"), so
    no multi-worker step runs.
    Scalars are averaged over the replicas with axis=None instead; everything else as Keras does.
    Public replacement: none; drop this once Keras reduces scalars with axis=None itself."""
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer

    original = trainer.reduce_per_replica
    if getattr(original, "patched", False):
        return

    def reduce_per_replica(values, strategy, reduction):
        if reduction in ("auto", "mean") and trainer._collective_all_reduce_multi_worker(strategy):
            def mean(v):
                one = v.values[0] if trainer._is_per_replica_instance(v) else v  # one replica per worker: a tensor
                if getattr(one, "shape", None) is not None and one.shape.rank == 0:
                    return strategy.reduce("MEAN", v, axis=None)
                return original(v, strategy, reduction)

            return tf.nest.map_structure(mean, values)
        return original(values, strategy, reduction)

    reduce_per_replica.patched = True
    trainer.reduce_per_replica = reduce_per_replica
