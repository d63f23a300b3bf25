"""The decode core: a request's rounds (draft, one target pass, the lossless accept rule, commit)
for one row or a batch of them: `engine.Engine`, `batch.Batch`, `verify`."""
