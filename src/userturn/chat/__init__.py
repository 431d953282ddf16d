"""A conversation into the exact prompt: the model's own chat template, the open USER turn and its stop markers."""
