"""How settings come in. conf/ holds the Hydra groups; schema.py types every key (one default each); Hydra composes
a run's config once; preflight.py's callback checks it (checks.py: the values; keys.py: the messages that name a
key; sweep.py: a sweep's jobs; arithmetic.py: batch, accumulation, length) before anything runs; training turns it
into the typed objects the model, optimizer and data take. docs.py generates docs/configuration.md."""
