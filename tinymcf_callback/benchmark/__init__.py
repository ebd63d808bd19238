"""The slow benchmark beside the fast probe: ETHICS-style preference pairs and lm-evaluation-harness tasks.

- ``pairs.py``: TRL-format preference pairs from a local file or a Hugging Face dataset, checked and sampled;
- ``encoding.py``: pairs to token ids (the prompt and each continuation apart; conversational pairs through the chat
  template as TRL renders them);
- ``sequences.py``: each distinct prompt and sequence once, and which share a forward call; ``scoring.py``: the
  pairs scored by the probe's engine (each prompt once, the continuations' log-probabilities only);
  ``selfcheck.py``: its check against each sequence scored alone, and the safer strategies;
- ``analysis.py``: accuracy and margin with intervals, changes between steps, agreement with the probe;
- ``lmeval.py``: lm-eval's own tasks through its Python API on the model already loaded;
- ``config.py``, ``runner.py``: :class:`BenchmarkConfig`, :class:`Benchmark` and :func:`evaluate_benchmark`;
- ``schedule.py``: a run's start, middle and end; ``history.py``: the benchmark's lines beside the probe's history;
  ``steps.py``: two steps of a run compared, the probe's change and the benchmark's.
"""
