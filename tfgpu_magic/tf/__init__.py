"""The TensorFlow room: the only place that imports TensorFlow, plans for it and hooks its import."""
