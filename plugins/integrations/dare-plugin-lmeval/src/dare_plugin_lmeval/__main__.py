"""``python -m dare_plugin_lmeval [lm_eval arguments]``: lm-eval's command line with the ``dare``
model registered, e.g. ``--model dare --model_args family=llada,path=DIR --tasks ...``."""

import sys


def main() -> None:
    from dare_plugin_lmeval._compat import load_lm_eval

    try:
        load_lm_eval()
        from lm_eval.__main__ import cli_evaluate
    except ImportError:
        sys.exit("error: lm-evaluation-harness is not installed; pip install 'dare-plugin-lmeval[lmeval]'")
    import dare_plugin_lmeval.model  # noqa: F401  (registers the `dare` model)

    cli_evaluate()


if __name__ == "__main__":
    main()
