"""World-model planning with SimDist.

Sub-packages in layers, each importing only those below it:
cli > ros > evaluation > training > planning > data > model.
"""
