"""What each round should do and what a run should have done: the cost model, the acceptance
models (`theory`), the adaptive policy and the breakdown of a run's figures (`analysis`)."""
