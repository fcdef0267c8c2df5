"""sim_video_world_model."""
