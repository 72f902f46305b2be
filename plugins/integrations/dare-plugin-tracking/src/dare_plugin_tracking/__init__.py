"""dare-plugin-tracking: experiment tracking (TensorBoard, Weights & Biases) as an observer.

This module is the plugin's manifest: only ``@hookimpl`` functions. It registers the
``tracking:`` section of the run config (:mod:`dare_plugin_tracking.config`) and follows a
training run through the core's lifecycle hooks (:mod:`dare_plugin_tracking.tracked_run`):

* ``dare_configure`` — check the section (unknown backend, package not installed) before any
  work starts;
* ``dare_on_run_start`` — open the writers (main process);
* ``dare_on_step_end`` / ``dare_on_eval`` — log every scalar metric / evaluation result;
* ``dare_unconfigure`` — flush and close (also after an error).
"""

from dare_core.api import ConfigSection, hookimpl
from dare_plugin_tracking import tracked_run
from dare_plugin_tracking.config import SECTION, TrackingConfig

__version__ = "0.1.0"


@hookimpl
def dare_register_config_sections(register):
    register(
        ConfigSection(
            SECTION, TrackingConfig, "Experiment tracking: TensorBoard / Weights & Biases (dare-plugin-tracking)."
        )
    )


@hookimpl
def dare_configure(config):
    tracked_run.configure(config)


@hookimpl
def dare_on_run_start(config, run_dir):
    tracked_run.start(run_dir)


@hookimpl
def dare_on_step_end(step, metrics):
    tracked_run.step(step, metrics)


@hookimpl
def dare_on_eval(step, label, metrics):
    tracked_run.evaluation(step, label, metrics)


@hookimpl
def dare_unconfigure(config):
    tracked_run.unconfigure()
