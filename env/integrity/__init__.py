"""Integrity: what counts as a reward hack, and how each one is caught.

- ``static_checks``: the solution's AST, before it runs (``analysis``, ``names``,
  ``registrations``, ``data_flow``: what the code refers to, registers and stores;
  ``compute_checks``, ``reach_checks``, ``state_checks``, ``reference_checks``: the rules;
  ``forbidden``, ``allowed``: the deny- and allow-lists; ``failure``: what a check reports).
- ``audit``: evidence collected inside the sandboxed child while the solution runs (every aten
  op, own kernel launches, tamper evidence, torch's process-wide state: ``global_state``).
- ``dynamic_checks``: verdicts from that evidence, on the trusted side.
- ``vocabulary``: the one allow-list of torch glue that all of them (and curation) read.
"""
