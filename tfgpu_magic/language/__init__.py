"""The policy language: the policy value and the directives that edit it (pure: no IPython, no TensorFlow)."""
