"""ament_python package `simdist_planner`: installs with `pip install -e .` and with colcon.

Versions are pinned only in requirements.txt; install_requires names what the code imports.
"""

from glob import glob

from setuptools import find_packages, setup

PACKAGE = "simdist_planner"

setup(
    name=PACKAGE,
    version="0.1.0",
    package_dir={"": "src"},
    packages=find_packages("src"),
    include_package_data=True,
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        (f"share/{PACKAGE}/launch", glob("launch/*.py")),
        (f"share/{PACKAGE}/config", glob("config/*.yaml")),
    ],
    python_requires=">=3.10",
    install_requires=["numpy", "pyyaml", "torch", "safetensors", "mujoco", "fast-simplification"],
    zip_safe=False,
    entry_points={
        "console_scripts": [
            # offline tools
            "simdist-generate = simdist_planner.cli.generate:main",
            "simdist-pretrain = simdist_planner.cli.pretrain:main",
            "simdist-eval = simdist_planner.cli.evaluate:main",
            "simdist-probe = simdist_planner.cli.probe:main",
            "simdist-readout = simdist_planner.cli.readout:main",
            "simdist-ablation = simdist_planner.cli.ablation:main",
            "simdist-select-checkpoint = simdist_planner.cli.select_checkpoint:main",
            "simdist-import-official = simdist_planner.cli.import_official:main",
            "simdist-adapt-experiment = simdist_adapter.experiment:main",
            "simdist-ladder = simdist_adapter.ladder:main",
            "simdist-slip = simdist_adapter.slip:main",
            "simdist-episode-report = simdist_adapter.episode_report:main",
            "simdist-bag = simdist_adapter.bag_tool:main",
            "simdist-view = simdist_viewer.cli:main",
            "simforcing-train = sim_video_world_model.train:main",
            "simforcing-eval = sim_video_world_model.evaluate:main",
            "simdist = simdist_planner.cli.simdist:main",
            # ROS 2 nodes (one executable each)
            "planner_node = simdist_planner.ros.planner_node:main",
            "adapter_node = simdist_adapter.adapter_node:main",
            "recorder_node = simdist_adapter.recorder_node:main",
            "replay_node = simdist_adapter.replay_node:main",
            "video_prediction_node = sim_video_world_model.video_node:main",
            "mujoco_driver_node = robot_drivers.mujoco_driver_node:main",
            "ur5e_rtde_driver_node = robot_drivers.ur5e_rtde_driver_node:main",
            "go2_sdk_driver_node = robot_drivers.go2_sdk_driver_node:main",
            "ingestion_node = robot_drivers.ingestion_node:main",
            "safety_supervisor_node = robot_drivers.safety_node:main",
            "viewer_node = simdist_viewer.viewer_node:main",
        ]
    },
)
