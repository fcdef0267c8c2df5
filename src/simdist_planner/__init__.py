"""World-model planning with SimDist: model <- data <- planning <- training <- evaluation <- ros / cli."""
