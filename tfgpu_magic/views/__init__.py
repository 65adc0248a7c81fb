"""The views: the `%tfgpu` magic, its completion, the widget panel and the text/HTML renderings."""
