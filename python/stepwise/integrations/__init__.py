"""stepwise inside the RL engines people train with: :mod:`stepwise.integrations.verl` (a
reward function and a dense-reward manager) and :mod:`stepwise.integrations.openrlhf` (a custom
reward function; ``stepwise serve --prm`` also answers OpenRLHF's ``--reward.remote_url``)."""
