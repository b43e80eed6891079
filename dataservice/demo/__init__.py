"""The demo (`python -m dataservice.demo`) and what it and the examples train on: the
DTensor tutorial's MLP and the scikit-learn digits as TFRecord shards. Needs the
`[demo]` extra."""
